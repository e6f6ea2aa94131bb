"""An embedder's calibration for int8 and uint8 answers, computed at compile time: the
built-in set's embeddings are the model's own (sentence-transformers' encode of the same
texts), the manifest's ranges those of its vectors as served (normalised), and a user's
file of texts is what calibrates when given."""

from __future__ import annotations

import numpy as np
import pytest

from neuronserve.artifact import read_manifest
from neuronserve.compile import CompileError
from neuronserve.compile.calibration import BUILT_IN, calibration_set
from neuronserve.quantization import CALIBRATION_FILE


def test_the_built_in_calibration_is_the_models_own_embeddings(minilm_artifact, minilm_dir):
    from sentence_transformers import SentenceTransformer

    m = read_manifest(minilm_artifact)
    assert m.calibration is not None and m.calibration.source == BUILT_IN
    texts, _ = calibration_set(None)
    assert m.calibration.texts == len(texts) >= 100
    kept = np.load(minilm_artifact / CALIBRATION_FILE)
    st = SentenceTransformer(str(minilm_dir), device="cpu")
    st.max_seq_length = m.grid.max_seq
    # its modules end in Normalize: what it encodes is the kept (pooled) vectors normalised
    want = st.encode(texts, convert_to_numpy=True)
    served = kept / np.linalg.norm(kept, axis=1, keepdims=True)
    np.testing.assert_allclose(served, want, atol=2e-5)
    assert not np.allclose(np.linalg.norm(kept, axis=1), 1.0)  # kept before normalising
    ranges = np.asarray(m.calibration.ranges)
    np.testing.assert_allclose(ranges, np.vstack((served.min(0), served.max(0))), atol=1e-7)


def test_a_users_file_of_texts_calibrates(tmp_path, tiny_embedder_dir):
    from helpers import compile_artifact

    texts = [f"text number {i} about {'paris' if i % 2 else 'revenue'}" for i in range(120)]
    given = tmp_path / "calibration.txt"
    given.write_text("\n".join(texts) + "\n\n")
    art = compile_artifact(
        tmp_path / "art", tiny_embedder_dir, "feature-extraction",
        module_format="torchscript", embedding_calibration=given,
    )  # fmt: skip
    m = read_manifest(art)
    assert m.calibration is not None
    assert (m.calibration.source, m.calibration.texts) == ("calibration.txt", 120)
    assert np.load(art / CALIBRATION_FILE).shape == (120, m.output_dim)
    given.write_text("only one\n")
    with pytest.raises(CompileError, match="holds 1 text"):
        calibration_set(given)
