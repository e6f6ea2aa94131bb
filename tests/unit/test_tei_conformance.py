"""text-embeddings-inference conformance, against TEI's own OpenAPI document.

`tests/tei_openapi.json` is huggingface/text-embeddings-inference's `docs/openapi.json`,
version 1.9.3 (commit 06670157fb6c1523482219bdb2d1660277d38088 of that file), copied
unchanged. Every route it lists is answered here, and every 2xx and 4xx answer is
checked against the schema the document gives for that route and status, so a drift
from TEI shows as a failing test. Where TEI's code and its document disagree, the
front follows the code (a batch too large: 422, as TEI's ErrorType::Validation answers;
the document says 413).

Each front serves one model, as a TEI server does: an embedder (prompts, every token's
vector), a SPLADE model, a classifier and a reranker, behind the in-process engine (the
point here is the front's HTTP answers; the same routes behind TorchServe and Triton are
in tests/servers/test_tei_servers.py).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest
from helpers import wait_for
from in_process_front import front
from tei_document import DOCUMENT, TEXTS, conforms

from neuronserve.runtime import Runner


@pytest.fixture(scope="module")
def fronts(tmp_path_factory, tei_models, classifier_runner, task_model):
    runners = {
        "embedder": Runner(tei_models["embedder"]),
        "splade": Runner(tei_models["splade"]),
        "classifier": classifier_runner,
        "reranker": Runner(task_model("rerank")[1]),
    }
    return {
        kind: (
            *front(tmp_path_factory.mktemp(kind), {runner.name: runner}, max_client_batch=4),
            runner,
        )
        for kind, runner in runners.items()
    }


def call(fronts, kind: str, method: str, path: str, body: Any = None, expect: int | None = None):
    client = fronts[kind][0]
    r = client.request(method, path, json=body)
    conforms(path, method, r)
    if expect is not None:
        assert r.status_code == expect, (path, kind, r.status_code, r.text[:300])
    return r


def test_every_route_of_the_document_is_served(fronts):
    from neuronserve.serve.front.routes import Api, endpoints

    serving = fronts["embedder"][2]
    ours = {(e.path, e.method) for e in endpoints(Api(serving, serving.metrics))}
    theirs = {(p, m.upper()) for p, ops in DOCUMENT["paths"].items() for m in ops}
    assert DOCUMENT["info"]["version"] == "1.9.3"
    assert theirs <= ours, sorted(theirs - ours)


def test_embed_and_openai_embeddings(fronts):
    runner = fronts["embedder"][3]
    got = call(fronts, "embedder", "POST", "/embed", {"inputs": TEXTS}, 200).json()
    want = [runner.responses_for_bodies([({"inputs": t}, None)])[0] for t in TEXTS]
    np.testing.assert_allclose(got, want, atol=1e-6)
    # one text, token ids (decoded, then embedded as that text), the parameters object
    ids = fronts["embedder"][0].post("/tokenize", json={"inputs": TEXTS[0]}).json()[0]
    by_ids = call(fronts, "embedder", "POST", "/embed",
                  {"inputs": [t["id"] for t in ids]}, 200).json()  # fmt: skip
    np.testing.assert_allclose(by_ids, got[:1], atol=1e-6)
    call(fronts, "embedder", "POST", "/embed", {"inputs": "x", "dimensions": 8}, 200)
    call(fronts, "embedder", "POST", "/embed", {"inputs": []}, 400)
    call(fronts, "embedder", "POST", "/embed", {"inputs": ["x"] * 5}, 422)
    call(fronts, "embedder", "POST", "/embed", {"inputs": "word " * 40}, 422)
    call(fronts, "embedder", "POST", "/embed", {"inputs": "x", "dimensions": 0}, 422)
    call(fronts, "embedder", "POST", "/embed", {"inputs": [10**9]}, 422)
    call(fronts, "classifier", "POST", "/embed", {"inputs": "x"}, 424)
    oa = call(fronts, "embedder", "POST", "/v1/embeddings", {"input": TEXTS}, 200).json()
    np.testing.assert_allclose([d["embedding"] for d in oa["data"]], got, atol=1e-6)
    call(fronts, "embedder", "POST", "/v1/embeddings", {"input": []}, 400)
    call(fronts, "embedder", "POST", "/v1/embeddings", {"input": ["x"] * 5}, 422)
    call(fronts, "classifier", "POST", "/v1/embeddings", {"input": "x"}, 424)


def test_normalize_false_answers_the_vector_as_pooled(fronts):
    """As text-embeddings-inference answers it: the model's pooled vector, not normalised
    (the worker normalises only when asked, its default); the same direction, and the
    same as the worker's own answer to `normalize: false`."""
    runner = fronts["embedder"][3]
    raw = np.array(
        call(fronts, "embedder", "POST", "/embed", {"inputs": TEXTS, "normalize": False}, 200)
        .json()
    )  # fmt: skip
    unit = np.array(call(fronts, "embedder", "POST", "/embed", {"inputs": TEXTS}, 200).json())
    norms = np.linalg.norm(raw, axis=1)
    assert not np.allclose(norms, 1.0, atol=1e-3), norms
    np.testing.assert_allclose(raw / norms[:, None], unit, atol=1e-6)
    own = runner.responses_for_bodies(
        [({"inputs": TEXTS, "parameters": {"normalize": False}}, None)]
    )
    np.testing.assert_allclose(raw, own[0], atol=1e-6)
    # cut to fewer dimensions: the first N of the pooled vector, then normalised if asked
    cut = call(fronts, "embedder", "POST", "/embed",
               {"inputs": TEXTS, "normalize": False, "dimensions": 8}, 200).json()  # fmt: skip
    np.testing.assert_allclose(cut, raw[:, :8], atol=1e-6)
    call(fronts, "embedder", "POST", "/embed",
         {"inputs": "x", "parameters": {"normalize": "no"}}, 422)  # fmt: skip


def test_prompts_are_applied_the_same_on_every_route(fronts):
    runner = fronts["embedder"][3]
    plain = runner.responses_for_bodies([({"inputs": "query: " + TEXTS[0]}, None)])[0]
    named = call(fronts, "embedder", "POST", "/embed",
                 {"inputs": TEXTS[0], "prompt_name": "query"}, 200).json()[0]  # fmt: skip
    np.testing.assert_allclose(named, plain, atol=1e-6)
    tokens = call(fronts, "embedder", "POST", "/tokenize",
                  {"inputs": TEXTS[0], "prompt_name": "query"}, 200).json()[0]  # fmt: skip
    assert [t["text"] for t in tokens[1:3]] == ["query", ":"]
    all_tokens = call(fronts, "embedder", "POST", "/embed_all",
                      {"inputs": TEXTS[0], "prompt_name": "query"}, 200).json()[0]  # fmt: skip
    assert len(all_tokens) == len(tokens)
    similarity = call(fronts, "embedder", "POST", "/similarity",
                      {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[:1]},
                       "parameters": {"prompt_name": "query"}}, 200).json()  # fmt: skip
    assert similarity == pytest.approx([1.0], abs=1e-5)
    unknown = call(fronts, "embedder", "POST", "/embed",
                   {"inputs": "x", "prompt_name": "title"}, 422).json()  # fmt: skip
    assert "'passage', 'query'" in unknown["error"]


def test_embed_all_gives_every_tokens_vector(fronts):
    runner = fronts["embedder"][3]
    got = call(fronts, "embedder", "POST", "/embed_all", {"inputs": TEXTS}, 200).json()
    tokens = fronts["embedder"][0].post("/tokenize", json={"inputs": TEXTS}).json()
    assert [len(rows) for rows in got] == [len(t) for t in tokens]
    pooled = np.array(runner.responses_for_bodies([({"inputs": TEXTS}, None)])[0])
    means = np.array([np.mean(rows, axis=0) for rows in got])
    np.testing.assert_allclose(means / np.linalg.norm(means, axis=1, keepdims=True), pooled,
                               atol=1e-5)  # fmt: skip
    call(fronts, "embedder", "POST", "/embed_all", {"inputs": []}, 400)
    call(fronts, "splade", "POST", "/embed_all", {"inputs": "x"}, 424)
    call(fronts, "classifier", "POST", "/embed_all", {"inputs": "x"}, 424)


def test_embed_sparse_lists_the_terms_that_weigh(fronts):
    runner = fronts["splade"][3]
    got = call(fronts, "splade", "POST", "/embed_sparse", {"inputs": TEXTS}, 200).json()
    assert got == runner.responses_for_bodies([({"inputs": TEXTS}, None)])[0]
    assert all(t["value"] > 0 for terms in got for t in terms) and all(got)
    # /embed on a SPLADE model: the whole vector, unnormalised only (as TEI)
    whole = call(fronts, "splade", "POST", "/embed",
                 {"inputs": TEXTS[:1], "normalize": False}, 200).json()[0]  # fmt: skip
    assert len(whole) == runner.manifest.output_dim
    assert {i: v for i, v in enumerate(whole) if v} == pytest.approx(
        {t["index"]: t["value"] for t in got[0]}
    )
    call(fronts, "splade", "POST", "/embed", {"inputs": "x"}, 424)
    call(fronts, "splade", "POST", "/embed_sparse", {"inputs": []}, 400)
    call(fronts, "embedder", "POST", "/embed_sparse", {"inputs": "x"}, 424)


def test_similarity_is_the_cosine_of_the_embeddings(fronts):
    vectors = np.array(fronts["embedder"][0].post("/embed", json={"inputs": TEXTS}).json())
    pair = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    got = call(fronts, "embedder", "POST", "/similarity", pair, 200).json()
    np.testing.assert_allclose(got, vectors[1:] @ vectors[0], atol=1e-5)
    call(fronts, "embedder", "POST", "/similarity",
         {"inputs": {"source_sentence": "x", "sentences": []}}, 400)  # fmt: skip
    call(fronts, "embedder", "POST", "/similarity",
         {"inputs": {"source_sentence": "x", "sentences": ["y"] * 4}}, 422)  # fmt: skip
    call(fronts, "reranker", "POST", "/similarity",
         {"inputs": {"source_sentence": "x", "sentences": ["y"]}}, 424)  # fmt: skip
    same = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[:1]}}
    sparse = call(fronts, "splade", "POST", "/similarity", same, 200)
    assert sparse.json() == pytest.approx([1.0], abs=1e-5)


def test_tokenize_and_decode_round_trip(fronts):
    tokens = call(fronts, "embedder", "POST", "/tokenize", {"inputs": TEXTS}, 200).json()
    ids = [[t["id"] for t in row] for row in tokens]
    texts = call(fronts, "embedder", "POST", "/decode", {"ids": ids}, 200).json()
    assert texts == [t.lower() for t in TEXTS]  # an uncased tokenizer
    with_special = call(fronts, "embedder", "POST", "/decode",
                        {"ids": ids[2], "skip_special_tokens": False}, 200).json()  # fmt: skip
    assert with_special == ["[CLS] a [SEP]"]
    call(fronts, "embedder", "POST", "/decode", {"ids": [10**9]}, 422)
    call(fronts, "embedder", "POST", "/decode", {"ids": [[1]] * 5}, 422)
    call(fronts, "embedder", "POST", "/tokenize", {"inputs": []}, 400)
    call(fronts, "embedder", "POST", "/tokenize", {"inputs": ["x"] * 5}, 422)
    call(fronts, "embedder", "POST", "/tokenize", {"inputs": "x", "prompt_name": "no"}, 422)


def test_predict_and_rerank(fronts):
    runner = fronts["classifier"][3]
    one = call(fronts, "classifier", "POST", "/predict", {"inputs": "good"}, 200).json()
    want = runner.responses_for_bodies([({"inputs": "good", "parameters": {"top_k": None}}, None)])
    assert one == want[0]
    call(fronts, "classifier", "POST", "/predict", {"inputs": ["a", "b"]}, 200)  # a pair
    call(fronts, "classifier", "POST", "/predict", {"inputs": [["a"], ["b", "c"]]}, 200)
    call(fronts, "classifier", "POST", "/predict", {"inputs": []}, 400)
    call(fronts, "classifier", "POST", "/predict", {"inputs": [["a"]] * 5}, 422)
    call(fronts, "embedder", "POST", "/predict", {"inputs": "x"}, 424)
    ranks = call(fronts, "reranker", "POST", "/rerank",
                 {"query": "q", "texts": TEXTS, "return_text": True}, 200).json()  # fmt: skip
    assert sorted(r["index"] for r in ranks) == [0, 1, 2]
    assert [r["score"] for r in ranks] == sorted((r["score"] for r in ranks), reverse=True)
    call(fronts, "reranker", "POST", "/rerank", {"query": "q", "texts": []}, 400)
    call(fronts, "reranker", "POST", "/rerank", {"query": "q", "texts": ["t"] * 5}, 422)
    call(fronts, "embedder", "POST", "/rerank", {"query": "q", "texts": ["t"]}, 424)


@pytest.mark.parametrize("kind", ["embedder", "splade", "classifier", "reranker"])
def test_info_carries_teis_fields(fronts, kind):
    info = call(fronts, kind, "GET", "/info", None, 200).json()
    want = {
        "embedder": {"embedding": {"pooling": "mean"}},
        "splade": {"embedding": {"pooling": "splade"}},
    }
    if kind in want:
        assert info["model_type"] == want[kind]
    else:
        labels = fronts[kind][3].manifest.labels
        assert info["model_type"] == {
            kind: {
                "id2label": {str(i): label for i, label in enumerate(labels)},
                "label2id": {label: i for i, label in enumerate(labels)},
            }
        }
    want_length = fronts[kind][3].manifest.sequence_lengths[-1]
    assert info["max_client_batch_size"] == 4 and info["max_input_length"] == want_length


def test_health_and_overload(tmp_path, fronts, monkeypatch):
    from neuronserve.serve.front import serving
    from neuronserve.workers.answers import WorkerCounts

    monkeypatch.setattr(serving, "HEALTH_TTL_S", 0.0)  # every probe asks the engine
    engine = fronts["embedder"][1]
    call(fronts, "embedder", "GET", "/health", None, 200)
    engine.counts = WorkerCounts(0, 2)
    try:
        assert call(fronts, "embedder", "GET", "/health", None, 503).json()["workers_ready"] == 0
    finally:
        engine.counts = WorkerCounts(2, 2)
    # a request past the in-flight bound: 429 in TEI's shape, its neighbours served
    busy, engine, _ = front(tmp_path, {"embedder": fronts["embedder"][3]}, max_in_flight=1)
    engine.hold = threading.Event()
    held = threading.Thread(target=lambda: busy.post("/embed", json={"inputs": "x"}))
    held.start()
    wait_for(lambda: engine.calls > 0, timeout=30, what="the held request to reach the engine")
    over = busy.post("/embed", json={"inputs": "y"})
    conforms("/embed", "POST", over)
    assert over.status_code == 429 and over.json()["error_type"] == "Overloaded"
    engine.hold.set()
    held.join()
    assert busy.post("/embed", json={"inputs": "y"}).status_code == 200


class _Answer:
    def __init__(self, status: int, body: Any):
        self.status_code, self._body, self.text = status, body, json.dumps(body)

    def json(self) -> Any:
        return self._body


@pytest.mark.parametrize(
    ("path", "answer"),
    [
        ("/embed", _Answer(200, [{"embedding": [0.1]}])),  # OpenAI's shape on TEI's route
        ("/embed", _Answer(413, {"code": 413, "error": "too large"})),  # not ErrorResponse
        ("/embed", _Answer(422, {"error": "x", "error_type": "validation"})),  # TEI spells it
        ("/embed", _Answer(404, {"error": "x", "error_type": "Validation"})),  # undocumented
        ("/embed_sparse", _Answer(200, [[{"index": 3}]])),
        ("/rerank", _Answer(200, [{"index": 0, "score": "high"}])),
    ],
)
def test_the_check_refuses_what_tei_would_not_answer(path, answer):
    with pytest.raises(AssertionError):
        conforms(path, "POST", answer)
