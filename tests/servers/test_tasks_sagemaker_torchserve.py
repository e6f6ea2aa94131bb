"""A rerank model through the SageMaker `serve` entrypoint with TorchServe behind it:
/invocations takes {"query", "documents"}, text-embeddings-inference's /rerank takes
{"query", "texts"}; both rank like the eager cross-encoder."""

from __future__ import annotations

import pytest
import requests
import torch
from helpers import compile_artifact, start_sagemaker, tiny_model

pytestmark = pytest.mark.server

QUERY = "where is the lake?"
DOCS = [
    "Zürich has a lake.",
    "naïve café 🎉",
    "x",
    "Paris is in France.",
    "東京",
    "a b c",
    "lake lake",
]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("sagemaker-rerank")
    model = tiny_model(root / "model", minilm_dir, "rerank", seed=19, initializer_range=0.5)
    return model, compile_artifact(root / "artifact", model, "rerank")


@pytest.fixture(scope="module")
def serve(tmp_path_factory, reranker):
    serve = start_sagemaker(
        tmp_path_factory.mktemp("sagemaker-ts-rerank"), reranker[1], "torchserve"
    )
    yield serve
    serve.stop()


def eager_scores(model_dir, query, documents):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = model(
            **tok([query] * len(documents), documents, return_tensors="pt", padding=True)
        ).logits
    return torch.sigmoid(logits[:, 0]).tolist()


def test_invocations_and_tei_rerank_rank_like_the_eager_model(serve, reranker):
    want = eager_scores(reranker[0], QUERY, DOCS)
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])
    r = requests.post(
        f"{serve.url}/invocations", json={"query": QUERY, "documents": DOCS}, timeout=60
    )
    assert r.status_code == 200, r.text
    assert [x["index"] for x in r.json()] == order
    assert all(abs(x["score"] - want[x["index"]]) < 1e-4 for x in r.json())
    tei = requests.post(
        f"{serve.url}/rerank",
        json={"query": QUERY, "texts": DOCS, "top_n": 3, "return_text": True},
        timeout=60,
    )
    assert tei.status_code == 200, tei.text
    assert [(x["index"], x["text"]) for x in tei.json()] == [(i, DOCS[i]) for i in order[:3]]
    empty = requests.post(
        f"{serve.url}/invocations", json={"query": QUERY, "documents": []}, timeout=60
    )
    assert empty.status_code == 400 and "at least one document" in empty.json()["error"]
