"""Embeddings quantized per request on /v1/embeddings, /embed and /invocations: each type
equals sentence-transformers' quantize_embeddings on the same float vectors with the
same calibration (the model's, from its artifact, in the form the request's vectors
took: normalised or not, truncated by `dimensions`), or the request's own ranges; base64
packs the same bytes; usage is as for float32; a model whose answers are not an
embedder's is a 422 naming what it answers."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from in_process_front import front
from sentence_transformers.util.quantization import quantize_embeddings

from neuronserve.quantization import CALIBRATION_FILE, TYPES

TINY = {"X-Amzn-SageMaker-Target-Model": "tiny"}
TEXTS = ["a short query", "a passage about the quarterly revenue of a company", "x", "ok"]
DTYPES = {"float32": "<f4", "int8": "i1", "uint8": "u1", "binary": "i1", "ubinary": "u1"}


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_runner, classifier_runner):
    client, _, _ = front(
        tmp_path_factory.mktemp("quantized"),
        {"tiny": tiny_runner, "tiny-classifier": classifier_runner},
    )
    return client, tiny_runner


def _calibration(runner) -> np.ndarray:
    return np.load(runner.artifact_dir / CALIBRATION_FILE)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _want(vectors, kind, calibration=None, ranges=None) -> np.ndarray:
    return np.asarray(
        quantize_embeddings(
            np.asarray(vectors, dtype=np.float32),
            kind,
            ranges=None if ranges is None else np.asarray(ranges, dtype=np.float32),
            calibration_embeddings=calibration,
        )
    )


def _embed(client) -> list:
    r = client.post("/embed", json={"inputs": TEXTS, "model": "tiny"})
    assert r.status_code == 200, r.text
    return r.json()


def _openai(client, kind, **fields):
    body = {"model": "tiny", "input": TEXTS, "embedding_type": kind, **fields}
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_every_type_on_every_route_is_sentence_transformers_own(served):
    client, runner = served
    manifest = runner.manifest
    assert manifest.calibration is not None and manifest.calibration.texts >= 100
    ranges = np.asarray(manifest.calibration.ranges, dtype=np.float32)
    # the manifest's ranges are the calibration embeddings' as served (normalised)
    np.testing.assert_array_equal(ranges[0], _unit(_calibration(runner)).min(0))
    floats = np.asarray(_embed(client), dtype=np.float32)
    for kind in TYPES:
        want = _want(floats, kind, ranges=ranges if kind.endswith("int8") else None)
        openai = _openai(client, kind)
        # JSON's numbers read back as the type asked (float32's shortest digits)
        got = np.asarray([d["embedding"] for d in openai["data"]], dtype=want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=kind)
        embed = client.post("/embed", json={"inputs": TEXTS, "embedding_type": kind,
                                            "model": "tiny"})  # fmt: skip
        np.testing.assert_array_equal(np.asarray(embed.json(), want.dtype), want, err_msg=kind)
        invoked = client.post(
            "/invocations",
            json={"inputs": TEXTS, "parameters": {"embedding_type": kind}},
            headers=TINY,
        )
        assert invoked.status_code == 200, invoked.text
        np.testing.assert_array_equal(np.asarray(invoked.json(), want.dtype), want, err_msg=kind)
        one = client.post(
            "/invocations",
            json={"inputs": TEXTS[0], "parameters": {"embedding_type": kind}},
            headers=TINY,
        )
        np.testing.assert_array_equal(np.asarray(one.json(), want.dtype), want[0], err_msg=kind)
        # base64: the same values' bytes, a byte each (float32: little-endian)
        packed = _openai(client, kind, encoding_format="base64")
        unpacked = [np.frombuffer(base64.b64decode(d["embedding"]), DTYPES[kind])
                    for d in packed["data"]]  # fmt: skip
        np.testing.assert_array_equal(np.asarray(unpacked), want, err_msg=kind)
        b64 = client.post("/embed", json={"inputs": TEXTS, "embedding_type": kind, "model": "tiny",
                                          "encoding_format": "base64"}).json()  # fmt: skip
        assert [np.frombuffer(base64.b64decode(v), DTYPES[kind]).tolist() for v in b64] == (
            want.tolist()
        )
        assert packed["usage"] == openai["usage"] == _openai(client, "float32")["usage"]
    assert _want(floats, "binary").shape == (len(TEXTS), manifest.output_dim // 8)


def test_dimensions_truncate_before_quantizing_by_ranges_of_truncated_vectors(served):
    client, runner = served
    calibration = _calibration(runner)
    # OpenAI's dimensions: the first 16 of the normalised vectors, normalised again
    floats = np.asarray(
        [d["embedding"] for d in _openai(client, "float32", dimensions=16)["data"]],
        dtype=np.float32,
    )
    cut = _unit(_unit(calibration)[:, :16]).astype(np.float32)
    for kind in ("int8", "uint8", "binary"):
        got = np.asarray([d["embedding"] for d in _openai(client, kind, dimensions=16)["data"]])
        np.testing.assert_array_equal(got, _want(floats, kind, calibration=cut), err_msg=kind)
    # TEI's, with normalize false: the pooled vectors cut, never normalised
    body = {"inputs": TEXTS, "dimensions": 8, "normalize": False, "model": "tiny"}
    raw = np.asarray(client.post("/embed", json=body).json(), dtype=np.float32)
    got = client.post("/embed", json={**body, "embedding_type": "uint8"}).json()
    want = _want(raw, "uint8", calibration=np.ascontiguousarray(calibration[:, :8]))
    np.testing.assert_array_equal(np.asarray(got), want)


def test_a_request_may_give_its_own_ranges(served):
    client, runner = served
    dim = runner.manifest.output_dim
    ranges = [[-0.05] * dim, [0.05] * dim]
    floats = np.asarray(_embed(client), dtype=np.float32)
    got = _openai(client, "int8", quantization_ranges=ranges)["data"]
    want = _want(floats, "int8", ranges=ranges)
    np.testing.assert_array_equal(np.asarray([d["embedding"] for d in got]), want)
    params = {"embedding_type": "uint8", "quantization_ranges": ranges}
    invoked = client.post(
        "/invocations", json={"inputs": TEXTS, "parameters": params}, headers=TINY
    )
    np.testing.assert_array_equal(np.asarray(invoked.json()), _want(floats, "uint8", ranges=ranges))
    short = client.post("/v1/embeddings", json={"model": "tiny", "input": TEXTS,
                                                "embedding_type": "int8",
                                                "quantization_ranges": [[0.0], [1.0]]})  # fmt: skip
    assert short.status_code == 422 and f"lists of {dim}" in short.text


def test_what_cannot_be_quantized_says_what_it_answers(served):
    client, _ = served
    wrong = client.post("/v1/embeddings", json={"model": "tiny", "input": "x",
                                                "embedding_type": "int4"})  # fmt: skip
    assert wrong.status_code == 422 and "embedding_type" in wrong.text
    classifier = client.post(
        "/invocations",
        json={"inputs": "fine", "parameters": {"embedding_type": "int8"}},
        headers={"X-Amzn-SageMaker-Target-Model": "tiny-classifier"},
    )
    assert classifier.status_code == 422, classifier.text
    assert "text-classification answers, not embeddings" in classifier.text
    tokens = client.post("/invocations", json={"inputs": "x", "parameters": {
        "embedding_type": "binary", "token_embeddings": True}}, headers=TINY)  # fmt: skip
    assert tokens.status_code == 422 and "every token's vector" in tokens.text
    neighbour = client.post("/embed", json={"inputs": TEXTS, "embedding_type": "ubinary",
                                            "model": "tiny"})  # fmt: skip
    assert neighbour.status_code == 200


def test_info_shows_the_types_and_the_calibration(served):
    client, runner = served
    info = client.get("/info", params={"model": "tiny"}).json()
    assert info["embedding_types"] == list(TYPES)
    c = runner.manifest.calibration
    assert info["calibration"] == {"texts": c.texts, "source": c.source, "ranges": c.ranges}
    assert "embedding_types" not in client.get("/info", params={"model": "tiny-classifier"}).json()


def test_a_splade_model_answers_its_term_weights_as_float32_only(tmp_path, tei_models):
    from neuronserve.runtime import Runner

    client, _, _ = front(tmp_path, {"splade": Runner(tei_models["splade"])})
    body = {"inputs": ["x"], "normalize": False}
    refused = client.post("/embed", json={**body, "embedding_type": "binary"})
    assert refused.status_code == 422 and "sparse-embedding model" in refused.text
    assert client.post("/embed", json=body).status_code == 200
