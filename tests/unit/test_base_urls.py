"""Every served model has a base URL of its own, /models/<name>, answering every TEI and
OpenAI route as a text-embeddings-inference serving that model alone would; and the
root never asks which model: POST / goes to the only model whose task's route takes the
body, else to the default model, as do /tokenize, /decode and /info. What a TEI client
posts to a URL as given then reaches the model it means, whichever of several."""

from __future__ import annotations

import pytest
from helpers import SENTENCES
from in_process_front import front

from neuronserve.runtime import Runner

KEY = "per-model-key"


@pytest.fixture(scope="module")
def runners(tiny_runner, classifier_runner, task_model):
    """An embedder, a three-label classifier and a cross-encoder: the RAG stack."""
    return {
        "tiny": tiny_runner,
        "tiny-classifier": classifier_runner,
        "rerank": Runner(task_model("rerank")[1]),
    }


@pytest.fixture(scope="module")
def rag(tmp_path_factory, runners):
    client, _, _ = front(tmp_path_factory.mktemp("rag"), runners)
    return client


def _answer(runner, body):
    return runner.responses_for_bodies([(body, None)])[0]


def test_each_model_answers_at_its_own_base_url(rag, runners):
    classifier = runners["tiny-classifier"]
    # the routes, by the model in the path; a request's own `model` field is ignored there
    embedded = rag.post("/models/tiny/embed", json={"inputs": SENTENCES[4], "model": "rerank"})
    assert embedded.status_code == 200, embedded.text
    assert embedded.json() == rag.post("/embed", json={"inputs": SENTENCES[4]}).json()
    predicted = rag.post("/models/tiny-classifier/predict", json={"inputs": "fine"})
    want = _answer(classifier, {"inputs": "fine", "parameters": {"top_k": None}})
    assert predicted.json() == want
    ranked = rag.post("/models/rerank/rerank", json={"query": "q", "texts": ["a", "q b"]})
    assert ranked.json() == rag.post("/rerank", json={"query": "q", "texts": ["a", "q b"]}).json()
    # the base URL itself is the model's POST /, as TEI's root is
    for path in ("/models/rerank", "/models/rerank/"):
        root = rag.post(path, json={"query": "q", "texts": ["a", "q b"]})
        assert root.status_code == 200 and root.json() == ranked.json(), (path, root.text)
    root = rag.post("/models/tiny-classifier", json={"inputs": "fine"})
    assert root.json() == want
    # OpenAI's client at <base>/v1: whatever model it names, the path's answers
    oa = rag.post("/models/tiny/v1/embeddings", json={"input": SENTENCES[4], "model": "x"})
    assert oa.status_code == 200 and oa.json()["model"] == "tiny"
    assert oa.json()["data"][0]["embedding"] == embedded.json()[0]
    listed = rag.get("/models/tiny/v1/models").json()["data"]
    assert [m["id"] for m in listed] == ["tiny"]
    # tokenize, decode, info and health of that model alone
    tokens = rag.post("/models/rerank/tokenize", json={"inputs": "hello"}).json()
    assert tokens == rag.post("/tokenize", json={"inputs": "hello", "model": "rerank"}).json()
    ids = [t["id"] for t in tokens[0]]
    assert rag.post("/models/rerank/decode", json={"ids": ids}).json() == ["hello"]
    info = rag.get("/models/rerank/info").json()
    assert info["model_id"] == "rerank" and "models" not in info
    assert rag.get("/models/rerank/health").json()["status"] == "ok"
    # a route the model does not serve, as TEI serving it alone: 424
    assert rag.post("/models/rerank/embed", json={"inputs": "x"}).status_code == 424


def test_a_model_not_served_has_no_base_url(rag):
    for method, path in (("POST", "/models/nope/embed"), ("GET", "/models/nope/info"),
                         ("GET", "/models/nope/health"), ("POST", "/models/nope")):  # fmt: skip
        r = rag.request(method, path, json={"inputs": "x"})
        assert r.status_code == 404, (path, r.status_code, r.text)
        assert "served: rerank, tiny, tiny-classifier" in r.text or "nope" in r.text
    bad = rag.post("/models/..%2F..%2Fetc/embed", json={"inputs": "x"})
    assert bad.status_code in (400, 404)


def test_the_root_never_asks(rag, runners):
    """POST / without a model: the only model whose route takes the body (a query and
    texts: the cross-encoder), else the default (the first served); /tokenize, /decode
    and /info the same, /info listing every model's base URL."""
    ranked = rag.post("/", json={"query": "q", "texts": ["a", "q b"]})
    assert ranked.status_code == 200
    assert ranked.json() == rag.post("/rerank", json={"query": "q", "texts": ["a", "q b"]}).json()
    texts = rag.post("/", json={"inputs": SENTENCES[4]})  # an embedder's and a classifier's
    assert texts.status_code == 200
    assert texts.json() == rag.post("/models/tiny/embed", json={"inputs": SENTENCES[4]}).json()
    tokens = rag.post("/tokenize", json={"inputs": "hello"})
    assert tokens.status_code == 200
    assert tokens.json() == rag.post("/models/tiny/tokenize", json={"inputs": "hello"}).json()
    assert rag.post("/decode", json={"ids": [101, 102]}).status_code == 200
    info = rag.get("/info").json()
    assert info["model_id"] == "tiny"
    assert {m["model_id"]: m["base_url"] for m in info["models"]} == {
        "tiny": "/models/tiny",
        "tiny-classifier": "/models/tiny-classifier",
        "rerank": "/models/rerank",
    }
    assert rag.get("/info", params={"model": "rerank"}).json()["model_id"] == "rerank"


def test_the_default_model_is_the_specs(tmp_path, runners):
    client, _, _ = front(tmp_path, runners, default_model="tiny-classifier")
    want = _answer(runners["tiny-classifier"], {"inputs": "fine", "parameters": {"top_k": None}})
    assert client.post("/", json={"inputs": "fine"}).json() == want
    assert client.get("/info").json()["model_id"] == "tiny-classifier"
    # a body only one model's route takes still goes to that one
    assert client.post("/", json={"query": "q", "texts": ["a"]}).status_code == 200


def test_a_base_url_asks_for_the_key_as_the_root_does(tmp_path, runners, monkeypatch):
    monkeypatch.setenv("NEURONSERVE_API_KEY", KEY)
    client, _, _ = front(tmp_path, runners, auth="on")
    for path in ("/models/tiny/embed", "/models/tiny/v1/embeddings", "/models/tiny"):
        r = client.post(path, json={"inputs": "x", "input": "x", "model": "tiny"})
        assert r.status_code == 401, path
    assert client.get("/models/tiny/info").status_code == 401
    assert client.get("/models/tiny/health").status_code == 200  # a probe, as /health
    ok = client.post(
        "/models/tiny/embed", json={"inputs": "x"}, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert ok.status_code == 200
