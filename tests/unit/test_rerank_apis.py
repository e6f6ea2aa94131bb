"""Cohere's /v2/rerank and the /v1/rerank Cohere's v1 and Jina's APIs share, through
Cohere's own SDK (ClientV2 and Client, pointed at the front in this process): a reranker
(the rerank task) and a one-label classifier beside an embedder. Scores equal /rerank's
for the same pairs; the order rules, documents as objects, max_tokens_per_doc, keys,
per-model base URLs and the errors each API's clients read. The clients guide runs
LangChain's, LlamaIndex's and Haystack's rerankers against a real front."""

from __future__ import annotations

import dataclasses

import cohere
import pytest
from in_process_front import front

from neuronserve.runtime import Runner
from neuronserve.serve.front.keys import Keys

QUERY = "where is paris"
DOCS = ["a cat sat on the mat", "paris is in france", "x", "paris paris", "the city of lights"]


@pytest.fixture(scope="module")
def runners(tiny_runner, task_model):
    return {"tiny": tiny_runner, "rerank": Runner(task_model("rerank")[1])}


@pytest.fixture(scope="module")
def rag(tmp_path_factory, runners):
    client, _, _ = front(tmp_path_factory.mktemp("rerank-apis"), runners)
    return client


def _v2(rag, base: str = "http://front") -> cohere.ClientV2:
    return cohere.ClientV2(api_key="anything", base_url=base, httpx_client=rag)


def _tei(rag, texts=DOCS, **fields) -> list[tuple[int, float]]:
    body = {"query": QUERY, "texts": texts, "model": "rerank", **fields}
    return [(r["index"], r["score"]) for r in rag.post("/rerank", json=body).json()]


def test_cohere_v2_ranks_as_rerank_does(rag):
    got = _v2(rag).rerank(model="rerank", query=QUERY, documents=DOCS)
    assert [(r.index, r.relevance_score) for r in got.results] == _tei(rag)
    assert got.meta.api_version.version == "2" and got.meta.billed_units.search_units == 1
    assert got.meta.tokens.input_tokens > len(DOCS)  # the pairs' tokens, specials included
    top = _v2(rag).rerank(model="rerank", query=QUERY, documents=DOCS, top_n=2)
    assert [(r.index, r.relevance_score) for r in top.results] == _tei(rag)[:2]
    scores = [r.relevance_score for r in got.results]
    assert scores == sorted(scores, reverse=True)


def test_cohere_v1_and_jina_share_v1_rerank(rag):
    v1 = cohere.Client(api_key="anything", base_url="http://front", httpx_client=rag)
    got = v1.rerank(model="rerank", query=QUERY, documents=DOCS, top_n=3, return_documents=True)
    assert [(r.index, r.relevance_score) for r in got.results] == _tei(rag)[:3]
    assert [r.document.text for r in got.results] == [DOCS[r.index] for r in got.results]
    # Jina's body: documents as objects, its answer's model and usage, documents by default
    jina = rag.post(
        "/v1/rerank",
        json={"model": "rerank", "query": QUERY, "documents": [{"text": d} for d in DOCS]},
    ).json()
    assert [(r["index"], r["relevance_score"]) for r in jina["results"]] == _tei(rag)
    assert jina["model"] == "rerank" and jina["usage"]["total_tokens"] > 0
    assert all(r["document"]["text"] == DOCS[r["index"]] for r in jina["results"])
    bare = rag.post(
        "/v1/rerank",
        json={"model": "rerank", "query": QUERY, "documents": DOCS, "return_documents": False},
    ).json()
    assert all("document" not in r for r in bare["results"])


def test_a_one_label_classifier_ranks_the_same_on_every_route(tmp_path, minilm_dir):
    """A cross-encoder compiled as a classifier of one label: /v2/rerank, /v1/rerank and
    /rerank give the same scores (the classifier's sigmoid)."""
    from helpers import compile_artifact, tiny_model

    model = tiny_model(tmp_path / "ce", minilm_dir, "text-classification", num_labels=1)
    art = compile_artifact(
        tmp_path / "ce-art", model, "text-classification", name="ce", module_format="torchscript"
    )
    client, _, _ = front(tmp_path, {"ce": Runner(art)})
    want = [(r["index"], r["score"]) for r in client.post(
        "/rerank", json={"query": QUERY, "texts": DOCS}).json()]  # fmt: skip
    got = _v2(client).rerank(model="ce", query=QUERY, documents=DOCS)
    assert [(r.index, r.relevance_score) for r in got.results] == want
    v1 = client.post("/v1/rerank", json={"model": "ce", "query": QUERY, "documents": DOCS})
    assert [(r["index"], r["relevance_score"]) for r in v1.json()["results"]] == want


def test_max_tokens_per_doc_cuts_each_document_first(rag):
    """Each document cut after its first two tokens: the scores of those cut texts."""
    long = ["paris is the capital of france", "cats sleep most of the day", "x"]
    cut = ["paris is", "cats sleep", "x"]
    got = _v2(rag).rerank(model="rerank", query=QUERY, documents=long, max_tokens_per_doc=2)
    assert [(r.index, r.relevance_score) for r in got.results] == _tei(rag, cut)
    # Haystack sends 4096 by default: more than any document here, nothing is cut
    whole = _v2(rag).rerank(model="rerank", query=QUERY, documents=long, max_tokens_per_doc=4096)
    assert [(r.index, r.relevance_score) for r in whole.results] == _tei(rag, long)


def test_each_model_has_the_rerank_routes_at_its_base_url(rag):
    at = _v2(rag, "http://front/models/rerank").rerank(model="any", query=QUERY, documents=DOCS)
    assert [(r.index, r.relevance_score) for r in at.results] == _tei(rag)


def test_errors_are_what_each_apis_clients_read(rag):
    with pytest.raises(cohere.core.api_error.ApiError) as e:
        _v2(rag).rerank(model="tiny", query=QUERY, documents=DOCS)
    assert e.value.status_code == 424 and "cross-encoder" in e.value.body["message"]
    unknown = rag.post("/v2/rerank", json={"model": "nope", "query": QUERY, "documents": DOCS})
    assert unknown.status_code == 404 and unknown.json()["detail"] == unknown.json()["message"]
    empty = rag.post("/v2/rerank", json={"model": "rerank", "query": QUERY, "documents": []})
    assert empty.status_code == 400 and "at least one document" in empty.json()["message"]
    # v2 takes texts only; a field neither API has is named
    objects = rag.post("/v2/rerank", json={"model": "rerank", "query": QUERY,
                                           "documents": [{"text": "a"}]})  # fmt: skip
    assert objects.status_code == 400 and "documents" in objects.json()["message"]
    extra = rag.post("/v1/rerank", json={"model": "rerank", "query": QUERY, "documents": DOCS,
                                         "max_chunks_per_doc": 3})  # fmt: skip
    assert extra.status_code == 400 and "max_chunks_per_doc" in extra.json()["message"]
    ok = rag.post("/v2/rerank", json={"model": "rerank", "query": QUERY, "documents": DOCS})
    assert ok.status_code == 200


def test_the_rerank_routes_need_the_key(tmp_path, runners):
    client, _, _ = front(tmp_path, runners)
    client.app.config = dataclasses.replace(client.app.config, keys=Keys((b"k",), "test"))
    body = {"model": "rerank", "query": QUERY, "documents": DOCS}
    for path in ("/v2/rerank", "/v1/rerank", "/models/rerank/v2/rerank"):
        assert client.post(path, json=body).status_code == 401
    good = cohere.ClientV2(api_key="k", base_url="http://front", httpx_client=client)
    assert len(good.rerank(model="rerank", query=QUERY, documents=DOCS).results) == len(DOCS)


def test_the_openapi_document_describes_them(rag):
    doc = rag.get("/openapi.json").json()
    for path, body, answer in (
        ("/v2/rerank", "CohereRerankRequest", "CohereRerankResponse"),
        ("/v1/rerank", "RerankV1Request", "RerankV1Response"),
    ):
        post = doc["paths"][path]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(body)
        ok = post["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        assert ok.endswith(answer), ok
    embed = doc["components"]["schemas"]["EmbedRequest"]["properties"]
    assert {"embedding_type", "quantization_ranges", "encoding_format"} <= set(embed)
