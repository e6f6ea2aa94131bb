"""Long texts chunked when a request asks (`chunking`), on /embed, /v1/embeddings and
/invocations: a text over the largest compiled length (128 tokens here) is split into
windows of that length on token boundaries, each with the special tokens, consecutive
windows sharing `overlap` tokens; the answer is their vectors pooled as asked and
normalised as the model does, or every window's vector with its span. The reference is
computed another way: transformers' own tokenizer splitting the text
(return_overflowing_tokens with a stride) and the eager model on each window, pooled by
hand. Without `chunking` a long text is refused as before."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from in_process_front import front
from transformers import AutoModel, AutoTokenizer

from neuronserve.runtime import Runner
from neuronserve.tasks.base import RequestLimits

LONG = " ".join(f"sentence {i} tells of the river, the bank and the boats." for i in range(40))
MEDIUM = " ".join(["a few words about the weather"] * 8)
SHORT = "a short text"
TEXTS = [LONG, SHORT, MEDIUM]
MAX = 128


@pytest.fixture(scope="module")
def client(tmp_path_factory, tiny_artifact):
    # the worker's limits, as packaging hands them to it (max_chunks_per_request)
    runner = Runner(tiny_artifact, limits=RequestLimits(chunks=40))
    c, _, _ = front(tmp_path_factory.mktemp("long"), {"tiny": runner}, max_chunks_per_request=40)
    return c


@pytest.fixture(scope="module")
def eager(tiny_embedder_dir):
    tok = AutoTokenizer.from_pretrained(tiny_embedder_dir)
    model = AutoModel.from_pretrained(tiny_embedder_dir).eval()

    def windows(text: str, overlap: int) -> tuple[np.ndarray, list[int]]:
        """Each window's mean-pooled vector (the artifact's pooling) and how many of the
        text's tokens it holds."""
        enc = tok(text, truncation=True, max_length=MAX, stride=overlap,
                  return_overflowing_tokens=True)  # fmt: skip
        vectors, held = [], []
        with torch.no_grad():
            for ids in enc["input_ids"]:
                hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
                vectors.append(hidden.mean(0).numpy())
                held.append(len(ids) - 2)  # [CLS] and [SEP]
        return np.stack(vectors), held

    return windows


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _want(eager, pooling: str, overlap: int) -> list:
    out = []
    for text in TEXTS:
        vectors, held = eager(text, overlap)
        if pooling == "none":
            out.append(_unit(vectors))
        elif pooling == "max":
            out.append(_unit(vectors.max(0)))
        else:
            w = np.asarray(held, dtype=np.float64)[:, None]
            out.append(_unit((vectors * w).sum(0) / w.sum()))
    return out


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_a_long_text_is_its_chunks_pooled_on_every_route(client, eager, tiny_embedder_dir, pooling):
    chunking = {"overlap": 16, "pooling": pooling}
    want = np.stack(_want(eager, pooling, 16))
    tei = client.post("/embed", json={"inputs": TEXTS, "chunking": chunking})
    assert tei.status_code == 200, tei.text
    openai = client.post("/v1/embeddings", json={"input": TEXTS, "chunking": chunking})
    assert openai.status_code == 200, openai.text
    body = {"inputs": TEXTS, "parameters": {"chunking": chunking}}
    sagemaker = client.post("/invocations", json=body)
    assert sagemaker.status_code == 200, sagemaker.text
    for got in (tei.json(), [d["embedding"] for d in openai.json()["data"]], sagemaker.json()):
        assert np.allclose(np.asarray(got, dtype=np.float32), want, atol=1e-4)
    # usage counts every token the model read: each window's, special tokens and the
    # shared ones included
    tok = AutoTokenizer.from_pretrained(tiny_embedder_dir)
    split = tok(TEXTS, truncation=True, max_length=MAX, stride=16, return_overflowing_tokens=True)
    assert openai.json()["usage"]["prompt_tokens"] == sum(len(ids) for ids in split["input_ids"])


def test_every_chunk_with_its_span(client, eager, tiny_embedder_dir):
    tok = AutoTokenizer.from_pretrained(tiny_embedder_dir)
    want = _want(eager, "none", 24)
    body = {"inputs": TEXTS, "chunking": {"overlap": 24, "pooling": "none"}}
    got = client.post("/embed", json=body)
    assert got.status_code == 200, got.text
    for text, chunks, vectors in zip(TEXTS, got.json(), want, strict=True):
        assert np.allclose([c["embedding"] for c in chunks], vectors, atol=1e-4)
        spans = [c["span"] for c in chunks]
        # the spans cover the text's tokens in order, neighbours sharing the overlap
        assert spans[0][0] == 0 and spans[-1][1] == len(
            tok(text, add_special_tokens=False).input_ids
        )
        assert all(b[0] == a[1] - 24 for a, b in itertools.pairwise(spans))
    assert len(got.json()[0]) > 1 and len(got.json()[1]) == 1
    openai = client.post("/v1/embeddings", json={"input": TEXTS, "chunking": body["chunking"]})
    assert openai.status_code == 200, openai.text
    data = openai.json()["data"]
    assert [d["index"] for d in data] == [i for i, c in enumerate(got.json()) for _ in c]
    assert [d["span"] for d in data] == [c["span"] for chunks in got.json() for c in chunks]
    # each chunk's vector comes as the model answers it: a reshaping of it is refused
    cut = client.post("/embed", json={**body, "dimensions": 8})
    assert cut.status_code == 422 and "pooling" in cut.text


def test_without_chunking_a_long_text_is_refused_and_bad_chunking_is_a_4xx(client):
    refused = client.post("/invocations", json={"inputs": [LONG]})
    assert refused.status_code == 413 and '"chunking": true' in refused.json()["error"]
    for chunking in ({"overlap": -1}, {"pooling": "median"}, {"overlap": 200}, {"size": 3}, "yes"):
        r = client.post(
            "/invocations", json={"inputs": [LONG], "parameters": {"chunking": chunking}}
        )
        assert 400 <= r.status_code < 500, (chunking, r.status_code, r.text)
        assert "chunking" in r.text
    # its neighbour is served, and the limit on chunks names itself: counted for the whole
    # request in the front (which sends it on in calls of the largest batch, 8 texts), and
    # by the worker for what it is sent
    assert client.post("/embed", json={"inputs": [SHORT], "chunking": True}).status_code == 200
    for texts in ([LONG] * 20, [LONG] * 9):
        many = client.post("/invocations", json={"inputs": texts, "parameters": {"chunking": True}})
        assert many.status_code == 413 and "max_chunks_per_request" in many.text, many.text
    assert client.post("/embed", json={"inputs": [LONG] * 8, "chunking": True}).status_code == 200
