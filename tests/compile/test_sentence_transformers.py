"""sentence-transformers folders compiled and served, against sentence-transformers itself
computing the same texts (the reference computed another way): Dense and Normalize
modules, prompts, SPLADE (a SparseEncoder, and --pooling splade on a bare masked-LM
model) on every CPU module format, every token's vector (/embed_all), and a module that
cannot be compiled refused by name."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import compile_artifact, tiny_model

from neuronserve.artifact import read_manifest

TEXTS = ["what is the capital of France?", "a", "Paris is the capital and largest city of France."]
FORMATS = ["torchscript", "onnx", "openvino"]


def _body(inputs, **parameters) -> tuple[bytes, str]:
    return json.dumps({"inputs": inputs, "parameters": parameters}).encode(), "application/json"


def _compiled(out: Path, model_dir: Path, task: str, **fields):
    return read_manifest(compile_artifact(out, model_dir, task, **fields))


def _answer(runner, inputs, **parameters):
    (got,) = runner.responses_for_bodies([_body(inputs, **parameters)])
    return got


@pytest.fixture(scope="module")
def dense_st_dir(tmp_path_factory, minilm_dir) -> Path:
    """A tiny encoder as sentence-transformers saves it: mean pooling, a Dense layer
    (32 -> 16, tanh), Normalize, and query/passage prompts."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize, Pooling, Transformer

    work = tmp_path_factory.mktemp("dense-st")
    hf = tiny_model(work / "hf", minilm_dir, "feature-extraction", seed=11)
    torch.manual_seed(12)
    st = SentenceTransformer(
        modules=[
            Transformer(str(hf)),
            Pooling(32, "mean"),
            Dense(32, 16, activation_function=torch.nn.Tanh()),
            Normalize(),
        ],
        prompts={"query": "query: ", "passage": "passage: "},
    )
    st.save(str(work / "st"))
    return work / "st"


@pytest.fixture(scope="module")
def splade_dir(tmp_path_factory, minilm_dir) -> Path:
    """A tiny masked-LM model saved as a sentence-transformers SparseEncoder."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    work = tmp_path_factory.mktemp("splade")
    mlm = tiny_model(work / "mlm", minilm_dir, "fill-mask", seed=21)
    encoder = SparseEncoder(modules=[MLMTransformer(str(mlm)), SpladePooling("max")])
    with warnings.catch_warnings():  # torch's "sparse CSR is beta", from its model card
        warnings.simplefilter("ignore", UserWarning)
        encoder.save(str(work / "st"))
    return work / "st"


@pytest.mark.parametrize("module_format", FORMATS)
def test_dense_normalize_and_prompts_equal_sentence_transformers(
    tmp_path, dense_st_dir, module_format
):
    from sentence_transformers import SentenceTransformer

    from neuronserve.runtime import Runner

    manifest = _compiled(tmp_path / "a", dense_st_dir, "feature-extraction",
                                module_format=module_format)  # fmt: skip
    assert manifest.output_dim == 16 and manifest.normalize and manifest.pooling == "mean"
    assert manifest.prompts["query"] == "query: " and manifest.prompts["passage"] == "passage: "
    runner = Runner(tmp_path / "a")
    st = SentenceTransformer(str(dense_st_dir), device="cpu")
    for prompt in (None, "query", "passage"):
        want = st.encode(TEXTS, prompt_name=prompt)
        got = np.array(_answer(runner, TEXTS, **({"prompt_name": prompt} if prompt else {})))
        np.testing.assert_allclose(got, want, atol=1e-4)
    # a prompt changes the answer (the check above could not tell otherwise)
    assert not np.allclose(st.encode(TEXTS, prompt_name="query"), st.encode(TEXTS), atol=1e-3)
    refused = _answer(runner, TEXTS, prompt_name="title")
    assert refused.status == 422 and "'passage', 'query'" in refused.message


def test_the_default_prompt_applies_when_a_request_names_none(tmp_path, dense_st_dir):
    from sentence_transformers import SentenceTransformer

    from neuronserve.runtime import Runner

    folder = tmp_path / "st"
    shutil.copytree(dense_st_dir, folder)
    config_file = folder / "config_sentence_transformers.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "default_prompt_name": "query"}))
    manifest = _compiled(tmp_path / "a", folder, "feature-extraction")
    assert manifest.default_prompt_name == "query"
    st = SentenceTransformer(str(folder), device="cpu")
    got = np.array(_answer(Runner(tmp_path / "a"), TEXTS))
    np.testing.assert_allclose(got, st.encode(TEXTS), atol=1e-4)
    np.testing.assert_allclose(got, st.encode(["query: " + t for t in TEXTS], prompt=""), atol=1e-4)


@pytest.mark.parametrize("module_format", FORMATS)
def test_splade_equals_sentence_transformers_sparse_encoder(tmp_path, splade_dir, module_format):
    from sentence_transformers import SparseEncoder

    from neuronserve.runtime import Runner

    # the default pooling finds the SparseEncoder's SpladePooling
    manifest = _compiled(tmp_path / "a", splade_dir, "feature-extraction",
                                module_format=module_format)  # fmt: skip
    assert manifest.task == "sparse-embedding" and manifest.pooling == "splade"
    encoder = SparseEncoder(str(splade_dir), device="cpu")
    want = encoder.encode(TEXTS, convert_to_sparse_tensor=False).numpy()
    got = _answer(Runner(tmp_path / "a"), TEXTS)
    assert len(got) == len(TEXTS)
    for terms, row in zip(got, want, strict=True):
        index = [t["index"] for t in terms]
        assert index == sorted(index) and all(t["value"] > 0 for t in terms)
        assert set(np.nonzero(row > 1e-4)[0]) <= set(index)
        dense = np.zeros_like(row)
        dense[index] = [t["value"] for t in terms]
        np.testing.assert_allclose(dense, row, atol=1e-4)
    assert manifest.output_dim == want.shape[1]


def test_pooling_splade_compiles_a_bare_masked_lm(tmp_path, minilm_dir):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from neuronserve.runtime import Runner

    mlm = tiny_model(tmp_path / "mlm", minilm_dir, "fill-mask", seed=5)
    manifest = _compiled(tmp_path / "a", mlm, "feature-extraction", pooling="splade")
    assert manifest.task == "sparse-embedding"
    # the formula by hand, one text at a time (no padding to mask)
    tok, model = AutoTokenizer.from_pretrained(mlm), AutoModelForMaskedLM.from_pretrained(mlm)
    got = _answer(Runner(tmp_path / "a"), TEXTS)
    for text, terms in zip(TEXTS, got, strict=True):
        with torch.no_grad():
            logits = model(**tok(text, return_tensors="pt")).logits[0]
        want = torch.log1p(torch.relu(logits)).amax(0).numpy()
        dense = np.zeros_like(want)
        dense[[t["index"] for t in terms]] = [t["value"] for t in terms]
        np.testing.assert_allclose(dense, want, atol=1e-4)


def test_pooling_splade_is_refused_for_another_task(tmp_path, minilm_dir):
    from neuronserve.compile import CompileError

    mlm = tiny_model(tmp_path / "clf", minilm_dir, "text-classification", seed=5)
    with pytest.raises(CompileError, match="splade is for embedding models"):
        compile_artifact(tmp_path / "a", mlm, "text-classification", pooling="splade")


@pytest.mark.parametrize("module_format", FORMATS)
def test_token_embeddings_equal_the_eager_hidden_states(tmp_path, tiny_embedder_dir, module_format):
    from transformers import AutoModel, AutoTokenizer

    from neuronserve.runtime import Runner

    manifest = _compiled(tmp_path / "a", tiny_embedder_dir, "feature-extraction",
                                pooling="mean", token_embeddings=True,
                                module_format=module_format)  # fmt: skip
    assert manifest.token_embeddings
    runner = Runner(tmp_path / "a")
    tok, model = (
        AutoTokenizer.from_pretrained(tiny_embedder_dir),
        AutoModel.from_pretrained(tiny_embedder_dir),
    )
    # a batch whose texts differ in length, so each is cut back to its own tokens
    tokens = _answer(runner, TEXTS, token_embeddings=True)
    pooled = np.array(_answer(runner, TEXTS))
    for text, rows, vector in zip(TEXTS, tokens, pooled, strict=True):
        with torch.no_grad():
            hidden = model(**tok(text, return_tensors="pt")).last_hidden_state[0].numpy()
        assert np.array(rows).shape == hidden.shape
        np.testing.assert_allclose(np.array(rows), hidden, atol=1e-4)
        np.testing.assert_allclose(vector, hidden.mean(0), atol=1e-4)


def test_token_embeddings_of_an_artifact_without_them_are_a_424(tiny_runner):
    refused = _answer(tiny_runner, TEXTS, token_embeddings=True)
    assert refused.status == 424 and "--token-embeddings" in refused.message
    assert len(_answer(tiny_runner, TEXTS)) == len(TEXTS)


@pytest.mark.parametrize(
    ("module", "named"),
    [
        ("sentence_transformers.models.WordWeights", "WordWeights"),
        ("sentence_transformers.models.LayerNorm", "LayerNorm"),
    ],
)
def test_a_module_that_cannot_be_compiled_is_refused_by_name(tmp_path, dense_st_dir, module, named):
    from neuronserve.compile import CompileError

    folder = tmp_path / "st"
    shutil.copytree(dense_st_dir, folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": len(modules), "name": "9", "path": "9_Extra", "type": module})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises((CompileError, ValueError), match=named):
        compile_artifact(tmp_path / "a", folder, "feature-extraction")


def test_a_dense_layer_whose_weights_are_a_pickle_is_refused(tmp_path, dense_st_dir):
    from safetensors.torch import load_file

    folder = tmp_path / "st"
    shutil.copytree(dense_st_dir, folder)
    dense = next(folder.glob("*_Dense"))
    torch.save(load_file(str(dense / "model.safetensors")), dense / "pytorch_model.bin")
    (dense / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"pytorch_model\.bin"):
        compile_artifact(tmp_path / "a", folder, "feature-extraction")
