"""Every route passes the same guard, and no cheap request makes a large answer (the third
security review's findings on the front): the body limit, the in-flight bound and the
deadline hold for each route of the table, enumerated, so a route added later without
them fails here; every token's vector and a SPLADE model's whole vectors are bounded by
max_answer_bytes before the engine is asked, in the front and in the worker. Each test
fails on the code before the fix (/decode skipped all three; /embed_all and SPLADE's
/embed and /similarity built what the request asked for, however large)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from in_process_front import front
from starlette.responses import Response

from neuronserve.runtime import Runner
from neuronserve.serve.front.routes import Api, endpoints
from neuronserve.serve.front.tei import cosine_similarities, sparse_as_dense
from neuronserve.tasks import RequestError
from neuronserve.tasks.base import RequestLimits

MIB = 2**20


@pytest.fixture(scope="module")
def runners(tei_models):
    return {"embedder": Runner(tei_models["embedder"]), "splade": Runner(tei_models["splade"])}


def _routes():
    return endpoints(Api(None, None))  # type: ignore[arg-type] - only the table is read


def _path(route) -> str:
    return route.path.replace("{name}", "embedder")


@pytest.fixture(scope="module")
def small_bodies(tmp_path_factory, runners):
    """One front for every route's body check (each is refused before it changes anything)."""
    return front(tmp_path_factory.mktemp("bodies"), runners, max_body_bytes=200)


@pytest.fixture(scope="module")
def saturated(tmp_path_factory, runners):
    """One front whose in-flight bound every route finds full."""
    client, _, serving = front(tmp_path_factory.mktemp("full"), runners, max_in_flight=3)
    client.app.in_flight = serving.config.max_in_flight
    return client


@pytest.mark.parametrize("route", _routes(), ids=lambda r: f"{r.method} {r.path}")
def test_every_route_refuses_a_body_over_the_limit(small_bodies, route):
    client, engine, _ = small_bodies
    r = client.request(route.method, _path(route), content=b"x" * 1000)
    assert r.status_code == 413, (r.status_code, r.text[:200])
    assert "max_body_bytes" in r.text
    assert engine.calls == 0


@pytest.mark.parametrize("route", _routes(), ids=lambda r: f"{r.method} {r.path}")
def test_every_route_but_the_probes_counts_against_the_in_flight_bound(saturated, route):
    r = saturated.request(route.method, _path(route))
    if route.probe:  # a busy front still answers its health checks and its scrapes
        assert r.status_code != 429, r.text
    else:
        assert r.status_code == 429, (r.status_code, r.text[:200])
        assert r.headers["retry-after"]


@pytest.mark.parametrize("route", _routes(), ids=lambda r: f"{r.method} {r.path}")
def test_every_route_is_held_to_its_deadline(tmp_path, runners, route, monkeypatch):
    async def stalls(api, request):
        await asyncio.sleep(30)
        return Response()

    monkeypatch.setattr(Api, route.handler.__name__, stalls)
    client, _, _ = front(tmp_path, runners)
    r = client.request(route.method, _path(route), headers={"X-Request-Timeout": "0.01"})
    assert r.status_code == 504, (r.status_code, r.text[:200])


def test_the_probes_are_the_only_routes_outside_the_in_flight_bound():
    assert sorted(r.path for r in _routes() if r.probe) == [
        "/health", "/metrics", "/models/{name}/health", "/ping"
    ]  # fmt: skip


def test_embed_all_over_max_answer_bytes_is_refused_before_the_engine(tmp_path, runners):
    """The reproduction, scaled to the tiny embedder (32 numbers a token): texts whose
    every token's vector would pass the limit. The refusal names the limit; a request
    within it is answered."""
    client, engine, _ = front(tmp_path, runners, max_answer_bytes=MIB)
    long = "word " * 40  # 32 tokens once cut: 32 x 32 numbers, about 16 KB a text
    r = client.post("/embed_all", json={"inputs": [long] * 100, "model": "embedder",
                                         "truncate": True})  # fmt: skip
    # 422: text-embeddings-inference's status for a request over a limit
    assert r.status_code == 422, r.text
    assert "max_answer_bytes" in r.json()["error"] and "3200 tokens" in r.json()["error"]
    assert engine.calls == 0
    ok = client.post("/embed_all", json={"inputs": [long] * 4, "model": "embedder",
                                          "truncate": True})  # fmt: skip
    assert ok.status_code == 200 and len(ok.json()) == 4


def test_the_worker_refuses_an_answer_over_the_limit_and_serves_its_neighbours(runners):
    """Direct callers of the engine (TorchServe's own API) meet the same bound in the
    worker, from the tokens, before the model runs: a worker never builds the answer."""
    artifact = runners["embedder"].artifact_dir
    runner = Runner(artifact, limits=RequestLimits(answer_bytes=MIB), warmup=False)
    long = "word " * 40
    big = {"inputs": [long] * 100, "parameters": {"token_embeddings": True, "truncate": True}}
    small = {"inputs": "hello", "parameters": {"token_embeddings": True}}
    refused, answered = runner.responses_for_bodies([(big, None), (small, None)])
    assert isinstance(refused, RequestError) and refused.status == 413
    assert "max_answer_bytes" in refused.message
    assert not isinstance(answered, RequestError) and len(answered) > 0


def test_splade_embed_is_bounded_and_similarity_never_builds_the_whole_vectors(tmp_path, runners):
    client, engine, _ = front(tmp_path, runners, max_answer_bytes=MIB)
    vocab = runners["splade"].manifest.output_dim
    fits = MIB // (vocab * 4)
    r = client.post("/embed", json={"inputs": ["x"] * (fits + 1), "model": "splade",
                                     "normalize": False})  # fmt: skip
    assert r.status_code == 422 and "max_answer_bytes" in r.json()["error"], r.text
    assert engine.calls == 0
    # the engine's answer counts too: this random SPLADE model weighs most terms
    ok = client.post("/embed", json={"inputs": ["x"], "model": "splade", "normalize": False})
    assert ok.status_code == 200 and len(ok.json()[0]) == vocab
    # /similarity from the terms, same cosines: 31 sentences' dense vectors (30 of them
    # about 3.7 MB) are more than the 1 MiB bound, which the small answer still passes
    texts = ["a cat sat", "a dog sat", "the market fell", "cats and dogs"]
    pair = {"source_sentence": texts[0], "sentences": texts[1:] * 10}
    assert len(pair["sentences"]) * vocab * 4 > 3 * MIB
    got = client.post("/similarity", json={"inputs": pair, "model": "splade"})
    assert got.status_code == 200, got.text
    sparse = runners["splade"].responses_for_bodies([({"inputs": texts}, None)])[0]
    dense = sparse_as_dense(sparse, vocab)
    want = cosine_similarities(dense[0], dense[1:])
    np.testing.assert_allclose(got.json()[:3], want, atol=1e-5)


def test_a_split_request_is_bounded_once_its_answers_are_joined(tmp_path, runners):
    """Each engine call bounds its own answer; a request over the model's largest batch
    goes in several calls, and what no one foretold (a SPLADE model's terms) is bounded
    once they are joined: five texts in calls of four and one, refused as written."""
    # this random SPLADE model weighs most of its terms: about 1 MiB of JSON a text
    client, engine, serving = front(tmp_path, runners, max_answer_bytes=3 * MIB)
    assert serving.models["splade"].max_batch == 4
    r = client.post("/embed_sparse", json={"inputs": ["x"] * 5, "model": "splade"})
    assert r.status_code == 422 and "as written" in r.json()["error"], r.text[:300]
    assert engine.calls == 2
    two = client.post("/embed_sparse", json={"inputs": ["x"] * 2, "model": "splade"})
    assert two.status_code == 200 and len(two.json()) == 2


def test_a_query_read_with_every_document_is_bounded_on_every_route(tmp_path, task_model):
    """A long query with many documents, each within max_text_chars and the body within
    max_body_bytes: the pairs it asks the workers to read are refused (413) on every route
    that reaches the task, before anything is tokenized, and its neighbour is answered; the
    worker (the adapters' way in) holds to the same bound."""
    runner = Runner(task_model("rerank")[1])
    client, engine, _ = front(tmp_path, {"rerank": runner}, max_body_bytes=200_000)
    big = {"query": "q " * 40_000, "documents": ["a document"] * 64}
    small = {"query": "q", "documents": ["a document", "q and more"]}
    r = client.post("/invocations", json={"inputs": big})
    assert r.status_code == 413 and "max_body_bytes" in r.text, r.text[:300]
    ok = client.post("/invocations", json={"inputs": small})
    assert ok.status_code == 200 and len(ok.json()) == 2, ok.text
    for path in ("/rerank", "/models/rerank/rerank", "/"):
        tei = client.post(path, json={"query": big["query"], "texts": big["documents"]})
        assert tei.status_code == 422 and "max_body_bytes" in tei.json()["error"], path
        ok = client.post(path, json={"query": "q", "texts": small["documents"]})
        assert ok.status_code == 200 and len(ok.json()) == 2, ok.text
    assert engine.calls == 4  # the neighbours alone
    worker = Runner(
        task_model("rerank")[1], limits=RequestLimits(total_chars=200_000), warmup=False
    )
    bodies = [({"inputs": big}, None), ({"inputs": small}, None)]
    refused, answered = worker.responses_for_bodies(bodies)
    assert isinstance(refused, RequestError) and refused.status == 413
    assert not isinstance(answered, RequestError) and len(answered) == 2
