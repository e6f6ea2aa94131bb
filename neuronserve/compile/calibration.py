"""An embedder's calibration for quantized answers (neuronserve.quantization): the fp32
eager model's pooled embeddings of a calibration set, kept in the artifact, and each
dimension's range of them as the model serves them by default, in the manifest.

The set is the user's (`embedding_calibration`: a file of texts, one a line) or a
built-in one of varied texts: compile's accuracy and calibration texts, from one word to
several sentences, so the ranges cover short queries and long passages alike."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..artifact import CalibrationSettings
from ..quantization import CALIBRATION_FILE, VectorForm, ranges_of
from .base import CompileError
from .texts import accuracy_texts, calibration_texts

if TYPE_CHECKING:
    from ..tokenization import TextTokenizer
    from .context import CompileContext

BUILT_IN = "built-in"
# fewer than this and sentence-transformers warns that the ranges are unstable
FEWEST = 100


def calibration_set(given: Path | None) -> tuple[list[str], str]:
    """The texts to calibrate on and where they came from."""
    if given is None:
        return accuracy_texts() + calibration_texts(), BUILT_IN
    try:
        texts = [line for line in Path(given).read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise CompileError(f"embedding_calibration {given}: {e}") from None
    if len(texts) < 2:
        raise CompileError(
            f"embedding_calibration {given} holds {len(texts)} text(s): give at least two, "
            f"one a line ({FEWEST} or more give stable ranges)"
        )
    return texts, Path(given).name


def calibrate(
    ctx: CompileContext, tokenizer: TextTokenizer, normalize: bool, out: Path
) -> CalibrationSettings:
    """Embed the calibration set with the eager model (cut to the grid's longest
    sequence), keep the pooled embeddings in `out`, and say their ranges as served."""
    texts, source = calibration_set(ctx.job.compile.embedding_calibration)
    rows = [e.row() for e in tokenizer.encode(texts, truncate=True)]
    outputs = ctx.eager_executor().run(rows)
    # a token-embeddings module answers its pooled vector first, then every token's
    pooled = np.stack([o[0] for o in outputs]) if isinstance(outputs, list) else outputs
    pooled = np.ascontiguousarray(pooled, dtype=np.float32)
    np.save(out / CALIBRATION_FILE, pooled, allow_pickle=False)
    ranges = ranges_of(VectorForm(normalize).apply(pooled))
    return CalibrationSettings(
        file=CALIBRATION_FILE, texts=len(texts), source=source, ranges=ranges.tolist()
    )
