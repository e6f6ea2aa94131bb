"""The front's HTTP handling in process (Starlette's test client on its ASGI app), in front
of an engine in this process: each model's Runner answers what a worker would. Routing by
model name, every client family's answers and errors, keys, limits, the in-flight bound,
the deadline, health and metrics. What needs a real engine behind a real front (its
start, TorchServe's and Triton's own behaviour, keep-alive, TLS) is in tests/servers."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from typing import Any

import numpy as np
import openai
import orjson
import pytest
from helpers import SENTENCES, as_sent, float32_in_fewest_digits
from in_process_front import config_of, front
from starlette.testclient import TestClient

from neuronserve.serve.front.app import build_app
from neuronserve.serve.front.serving import Serving
from neuronserve.spec import load_spec
from neuronserve.workers.answers import WorkerCounts

KEY = "front-key"


@pytest.fixture
def two(tmp_path, tiny_runner, classifier_runner):
    """An embedder ("tiny") and a three-label classifier ("tiny-classifier")."""
    client, engine, _ = front(tmp_path, {"tiny": tiny_runner, "tiny-classifier": classifier_runner})
    return client, engine


def test_routes_find_their_model_by_name_or_by_task(two, tiny_runner, classifier_runner):
    client, _ = two
    embed = client.post("/embed", json={"inputs": SENTENCES[4]})
    assert embed.status_code == 200
    want = tiny_runner.responses_for_bodies([({"inputs": SENTENCES[4]}, None)])[0]
    assert embed.json() == [as_sent(want)]
    want = classifier_runner.responses_for_bodies(
        [({"inputs": "ok", "parameters": {"top_k": None}}, None)]
    )[0]
    assert client.post("/predict", json={"inputs": "ok"}).json() == want
    assert client.post("/predict", json={"inputs": "ok", "model": "tiny-classifier"}).json() == want
    # a model the route does not apply to, an unknown one, several that fit and none named
    wrong = client.post("/embed", json={"inputs": "x", "model": "tiny-classifier"})
    assert wrong.status_code == 424 and wrong.json()["error_type"] == "Backend"
    assert (
        "tiny-classifier is text-classification (this server's tiny would)" in wrong.json()["error"]
    )
    unknown = client.post("/embed", json={"inputs": "x", "model": "nope"})
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "no model 'nope' here; served: tiny, tiny-classifier"
    # /tokenize, as the root: several text models and none named, the default (the first)
    assert client.post("/tokenize", json={"inputs": "x"}).json() == (
        client.post("/tokenize", json={"inputs": "x", "model": "tiny"}).json()
    )
    rerank = client.post("/rerank", json={"query": "q", "texts": ["a"]})
    assert rerank.status_code == 424 and "cross-encoder" in rerank.json()["error"]
    # the other models keep answering
    assert client.post("/embed", json={"inputs": "still"}).status_code == 200


def test_sagemaker_target_model_header_picks_the_model(two, classifier_runner):
    client, _ = two
    header = {
        "X-Amzn-SageMaker-Target-Model": "tiny-classifier",
        "Content-Type": "application/json",
    }
    r = client.post("/invocations", content=b'{"inputs": "fine"}', headers=header)
    assert r.status_code == 200
    assert r.json() == classifier_runner.responses_for_bodies([({"inputs": "fine"}, None)])[0]
    # what SageMaker sends for a model whose archive is <name>.tar.gz
    archive = {**header, "X-Amzn-SageMaker-Target-Model": "tiny-classifier.tar.gz"}
    assert (
        client.post("/invocations", content=b'{"inputs": "fine"}', headers=archive).json()
        == r.json()
    )
    none = client.post(
        "/invocations", content=b'{"inputs": "x"}', headers={"Content-Type": "application/json"}
    )
    assert none.status_code == 400 and "X-Amzn-SageMaker-Target-Model" in none.json()["error"]
    gone = client.post(
        "/invocations", content=b"{}", headers={**header, "X-Amzn-SageMaker-Target-Model": "x"}
    )
    assert gone.status_code == 404


def test_embeddings_are_float32_in_their_fewest_digits(two, tiny_runner):
    """The runner's float32 numbers exactly, each in the fewest digits that read back as
    it (as TEI writes them), on TEI's route and OpenAI's."""
    client, _ = two
    want = tiny_runner.responses_for_bodies([({"inputs": SENTENCES[:2]}, None)])[0]
    embed = client.post("/embed", json={"inputs": SENTENCES[:2]})
    openai_ = client.post("/v1/embeddings", json={"input": SENTENCES[:2], "model": "tiny"})
    assert embed.status_code == openai_.status_code == 200, (embed.text, openai_.text)
    assert np.array_equal(np.asarray(embed.json(), dtype=np.float32), want)
    got = [d["embedding"] for d in openai_.json()["data"]]
    assert np.array_equal(np.asarray(got, dtype=np.float32), want)
    assert float32_in_fewest_digits(embed.content) and float32_in_fewest_digits(openai_.content)
    assert not float32_in_fewest_digits(orjson.dumps(want.tolist()))  # a float64's digits


def test_openai_usage_counts_the_tokens_the_model_reads(
    two, tiny_embedder_dir, tiny_runner, monkeypatch
):
    """usage.prompt_tokens: each text's tokens by transformers' own tokenizer (special
    tokens included), summed: as the engine's worker counted them while tokenizing (the
    front does not tokenize again), or, from an engine that does not say, counted by the
    front; `TextTokenizer.lengths` bounds a longer text by what the model reads of it,
    as `encode` with truncation keeps."""
    from transformers import AutoTokenizer

    from neuronserve.tokenization import TextTokenizer

    client, engine = two
    tok = AutoTokenizer.from_pretrained(tiny_embedder_dir)
    texts = [SENTENCES[0], SENTENCES[1] * 3]
    want = sum(len(tok(t)["input_ids"]) for t in texts)

    def not_here(self, texts):
        raise AssertionError("the front tokenized the texts again")

    with monkeypatch.context() as m:
        m.setattr(TextTokenizer, "lengths", not_here)
        r = client.post("/v1/embeddings", json={"input": texts, "model": "tiny"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {"prompt_tokens": want, "total_tokens": want}
    run = engine.run

    async def says_nothing(model, request):
        results = await run(model, request)
        request.tokens = None  # an answer without TOKENS
        return results

    monkeypatch.setattr(engine, "run", says_nothing)
    r = client.post("/v1/embeddings", json={"input": texts, "model": "tiny"})
    assert r.json()["usage"] == {"prompt_tokens": want, "total_tokens": want}
    ours = tiny_runner.tokenizer
    long = " ".join(SENTENCES) * 20
    assert len(tok(long)["input_ids"]) > ours.max_length
    short = list(SENTENCES[:3])
    kept = ours.encode([*short, long], truncate=True)
    assert ours.lengths([*short, long]) == [len(e.ids) for e in kept]
    assert ours.lengths([long]) == [ours.max_length]


def test_the_workers_answer_carries_each_texts_token_count(tiny_embedder_dir, tiny_runner):
    """What a worker answers the front holds the Runner's results and each text's tokens
    as transformers counts them; a worker that counted none (an image model) says so."""
    from transformers import AutoTokenizer

    from neuronserve.workers.wire import answer, read_frame, results

    tok = AutoTokenizer.from_pretrained(tiny_embedder_dir)
    texts = [SENTENCES[0], SENTENCES[1] * 3, "a"]
    request = tiny_runner.parse({"inputs": texts})
    [rows] = tiny_runner.outputs([request])
    want = [len(tok(t)["input_ids"]) for t in texts]
    assert request.tokens == want

    async def sent(tokens: list[int] | None) -> tuple[dict, Any]:
        reader = asyncio.StreamReader()
        reader.feed_data(answer({"id": 1, "status": 200, "tokens": tokens}, rows))
        reader.feed_eof()
        head, body = await read_frame(reader, 1 << 24)
        return head, results(head, body)

    head, got = asyncio.run(sent(request.tokens))
    assert head["tokens"] == want and np.array_equal(got, rows)
    assert asyncio.run(sent(None))[0]["tokens"] is None


def test_openai_client_names_its_model(two, tiny_runner):
    client, _ = two
    oa = openai.OpenAI(base_url="http://front/v1", api_key="k", http_client=client, max_retries=0)
    assert [m.id for m in oa.models.list()] == ["tiny", "tiny-classifier"]
    got = oa.embeddings.create(model="tiny", input=SENTENCES[:3])  # base64 on the wire
    want = np.array(tiny_runner.responses_for_bodies([({"inputs": SENTENCES[:3]}, None)])[0])
    assert np.allclose([d.embedding for d in got.data], want, atol=1e-6) and got.model == "tiny"
    cut = oa.embeddings.create(
        model="tiny", input=SENTENCES[:2], dimensions=8, encoding_format="float"
    )
    expect = want[:2, :8] / np.linalg.norm(want[:2, :8], axis=1, keepdims=True)
    assert np.allclose([d.embedding for d in cut.data], expect, atol=1e-6)
    with pytest.raises(openai.NotFoundError, match="served: tiny, tiny-classifier"):
        oa.embeddings.create(model="text-embedding-3-small", input="x")
    with pytest.raises(openai.APIStatusError, match="needs a feature-extraction model") as e:
        oa.embeddings.create(model="tiny-classifier", input="x")
    assert e.value.status_code == 424
    r = client.post(
        "/v1/embeddings", json={"input": "x", "model": "tiny", "encoding_format": "base64"}
    )
    vector = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(
        vector,
        want[0] * 0 + np.array(tiny_runner.responses_for_bodies([({"inputs": "x"}, None)])[0]),
        atol=1e-6,
    )


def test_info_lists_every_model_and_metrics_label_them(two):
    client, _ = two
    info = client.get("/info").json()
    assert info["model_id"] == "tiny" and [m["model_id"] for m in info["models"]] == [
        "tiny",
        "tiny-classifier",
    ]
    assert info["models"][1]["model_type"]["classifier"]["id2label"]["2"] == "positive"
    client.post("/predict", json={"inputs": "ok"})
    client.post("/embed", json={"inputs": "x", "model": "nope"})
    text = client.get("/metrics").text
    series = 'neuronserve_front_requests_total{model="tiny-classifier",route="/predict",'
    assert series + 'status="200"} 1.0' in text
    assert 'neuronserve_front_requests_total{model="",route="/embed",status="404"} 1.0' in text
    assert "# the workers'" in text


def test_keys_are_asked_for_everywhere_but_the_probes(tmp_path, tiny_runner, monkeypatch):
    monkeypatch.setenv("NEURONSERVE_API_KEY", KEY)
    client, _, _ = front(tmp_path, {"tiny": tiny_runner}, auth="on")
    for path in ("/embed", "/v1/embeddings", "/invocations", "/tokenize"):
        r = client.post(path, json={"inputs": "x", "input": "x"})
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer"), path
    assert client.get("/info").status_code == 401 and client.get("/metrics").status_code == 401
    for probe in ("/health", "/ping", "/openapi.json", "/docs"):
        assert client.get(probe).status_code == 200, probe
    wrong = client.post("/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error_type"] == "Validation"
    ok = client.post("/embed", json={"inputs": "x"}, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200


def test_limits_refuse_one_request_and_serve_the_next(tmp_path, tiny_runner):
    client, engine, _ = front(
        tmp_path, {"tiny": tiny_runner}, max_body_bytes=2_000, max_client_batch=4
    )
    big = client.post("/embed", json={"inputs": "x" * 3_000})
    assert big.status_code == 413 and "max_body_bytes" in big.json()["error"]
    # too many texts: 422, as text-embeddings-inference answers it
    many = client.post("/embed", json={"inputs": ["x"] * 5})
    assert many.status_code == 422 and "max_client_batch" in many.json()["error"]
    assert engine.calls == 0  # refused before the engine was asked
    bad = client.post("/v1/embeddings", json={"input": [1.5, 2], "model": "tiny"})
    assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_request_error"
    assert client.post("/embed", json={"inputs": ["x"] * 4}).status_code == 200


def test_in_flight_bound_and_deadline(tmp_path, tiny_runner):
    client, engine, _ = front(tmp_path, {"tiny": tiny_runner}, max_in_flight=2, deadline_s=2)
    engine.hold = threading.Event()  # every request now waits for the engine
    answers: list[Any] = []

    def call() -> None:
        answers.append(
            client.post("/embed", json={"inputs": "x"}, headers={"X-Request-Timeout": "1"})
        )

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    # two requests are in flight (waiting on the engine): a third is refused at once
    for _ in range(200):
        if engine.calls == 2:
            break
        threading.Event().wait(0.01)
    busy = client.post("/embed", json={"inputs": "x"})
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    for t in threads:
        t.join()
    # the client's X-Request-Timeout (1 s, sooner than deadline_s) ran out: 504 each
    assert [a.status_code for a in answers] == [504, 504]
    assert "X-Request-Timeout" in answers[0].json()["error"]
    engine.hold = None
    assert client.post("/embed", json={"inputs": "x"}).status_code == 200


def test_health_follows_the_engines_workers(tmp_path, tiny_runner):
    client, engine, serving = front(tmp_path, {"tiny": tiny_runner})
    assert client.get("/health").json() == {
        "status": "ok",
        "workers_ready": 2,
        "workers_expected": 2,
    }
    assert client.get("/ping").json() == {"status": "ready"}
    # a worker died: not every worker is ready (answered for a second: then asked again)
    engine.counts = WorkerCounts(1, 2)
    serving._health = None
    # degraded but serving: 200, so probes keep it in rotation while the worker is replaced
    r = client.get("/health")
    assert r.status_code == 200 and r.json() == {
        "status": "degraded",
        "workers_ready": 1,
        "workers_expected": 2,
    }
    assert client.get("/ping").status_code == 200
    assert client.get("/ping").json() == {"status": "degraded"}
    engine.counts = WorkerCounts(0, 2)
    serving._health = None
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["status"] == "unhealthy"
    assert client.get("/ping").status_code == 503


def test_a_loading_front_says_503_with_retry_after(tmp_path):
    config = config_of(load_spec(None, {"front_run_dir": tmp_path}))
    client = TestClient(build_app(Serving(config)))
    for path in ("/health", "/ping"):
        assert client.get(path).status_code == 503
    r = client.post("/embed", json={"inputs": "x"})
    assert r.status_code == 503 and r.headers["retry-after"] == "5"


def test_a_cheap_request_cannot_cost_the_front_a_lot(tmp_path, tiny_runner):
    """400,000 wrong items are one short 422 naming the first (it was a 23 MB answer and
    seconds of the event loop); /tokenize holds to max_text_chars and to what the model
    reads (a 1.9 MB text was a 65 MB answer); the neighbours are answered."""
    client, _, _ = front(tmp_path, {"tiny": tiny_runner}, max_text_chars=1000)
    json_type = {"content-type": "application/json"}
    wrong = client.post("/embed", content=json.dumps({"inputs": [-1] * 400_000}), headers=json_type)
    assert wrong.status_code == 422 and len(wrong.content) < 1000, len(wrong.content)
    assert "inputs.0" in wrong.json()["error"]
    # as many token ids: one text longer than the model reads, refused before decoding
    ids = client.post("/embed", content=json.dumps({"inputs": [1] * 500_000}), headers=json_type)
    assert ids.status_code == 422 and "500000 token ids" in ids.json()["error"]
    assert client.post("/embed", json={"inputs": ["fine"] * 3}).status_code == 200
    over = client.post("/tokenize", json={"inputs": ["ok", "x" * 1001]})
    assert over.status_code == 422 and "max_text_chars" in over.json()["error"]
    limit = tiny_runner.manifest.tokenizer.max_length
    words = client.post("/tokenize", json={"inputs": "a " * (limit + 1)})
    assert words.status_code == 422 and f"reads at most {limit}" in words.json()["error"]
    ok = client.post("/tokenize", json={"inputs": ["hello world", "a " * (limit // 2)]})
    assert ok.status_code == 200 and len(ok.json()) == 2


def test_the_docs_page_runs_only_scripts_the_front_serves(tmp_path, tiny_runner):
    """The page where users paste keys loads Swagger UI from the front itself (the
    swagger-ui-py package's files), not from a CDN at view time."""
    import importlib.util
    import re
    from pathlib import Path

    client, _, _ = front(tmp_path, {"tiny": tiny_runner})
    page = client.get("/docs").text
    sources = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert sources and not any("//" in src for src in sources), sources
    static = Path(next(iter(importlib.util.find_spec("swagger_ui").submodule_search_locations)))
    for src in sources:
        served = client.get(f"/{src}")
        assert served.status_code == 200, src
        assert served.content == (static / "static" / src.rsplit("/", 1)[-1]).read_bytes()
    assert client.get("/docs/../front.json").status_code == 404


def test_the_root_answers_with_the_models_own_task_as_tei_does(two, tiny_runner, classifier_runner):
    client, _ = two
    embed = client.post("/", json={"inputs": SENTENCES[4], "model": "tiny"})
    assert embed.status_code == 200
    assert embed.json() == client.post("/embed", json={"inputs": SENTENCES[4]}).json()
    predict = client.post("/", json={"inputs": "ok", "model": "tiny-classifier"})
    assert predict.status_code == 200
    assert predict.json() == client.post("/predict", json={"inputs": "ok"}).json()
    # several models take the body and none is named: the default model (the first), as a
    # TEI client posting to the root expects an answer (tests/unit/test_base_urls.py)
    several = client.post("/", json={"inputs": SENTENCES[4]})
    assert several.status_code == 200 and several.json() == embed.json()
    bad = client.post("/", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code in (400, 422)


def test_tei_series_are_served_beside_ours(two):
    client, _ = two
    assert client.post("/embed", json={"inputs": "a"}).status_code == 200
    assert client.post("/predict", json={"inputs": "ok"}).status_code == 200
    assert client.post("/embed", json={"inputs": "x", "model": "nope"}).status_code == 404
    client.get("/health")  # a probe: not an inference request
    client.post("/tokenize", json={"inputs": "x", "model": "tiny"})  # not one either
    text = client.get("/metrics").text
    assert "te_request_count_total 3.0" in text
    assert "te_request_success_total 2.0" in text
    assert 'te_request_failure_total{err="validation"} 1.0' in text
    assert "te_request_duration_count 2.0" in text
    assert "te_request_inference_duration_count 2.0" in text
    assert "te_queue_size 0.0" in text


def test_workers_whose_queue_is_full_answer_503_with_retry_after(two, monkeypatch):
    """A worker refused at once (its queue full): on every route a 503 telling the
    client when to come back, in that route's error shape, then served again."""
    from neuronserve.tasks import RequestError

    client, engine = two
    ran = engine.run

    async def full(model, request):
        raise RequestError("the worker's queue is full (max_queued 4)", 503)

    monkeypatch.setattr(engine, "run", full)
    target = {"X-Amzn-SageMaker-Target-Model": "tiny"}
    for path, body, headers in (
        ("/embed", {"inputs": "x"}, {}),
        ("/v1/embeddings", {"input": "x", "model": "tiny"}, {}),
        ("/invocations", {"inputs": "x"}, target),
    ):
        r = client.post(path, json=body, headers=headers)
        assert r.status_code == 503 and r.headers["retry-after"] == "5", (path, r.text)
        assert "queue is full" in r.text, path
    monkeypatch.setattr(engine, "run", ran)
    assert client.post("/embed", json={"inputs": "x"}).status_code == 200
