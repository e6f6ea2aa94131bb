"""The front's contract: one real server serving three models of three tasks (MiniLM
embeddings, a reranker, a classifier: each worker holds all three), started by
`neuronserve serve front` with keys from a file and small limits. The official openai
client and huggingface_hub's, the text-embeddings-inference routes by model, limits, the
in-flight bound, the deadline with frozen workers, the workers' metrics, keep-alive;
answers equal the Runners in process (each model as if served alone). Last: the run
directory serves another model after a stop. The front's HTTP handling alone is tested
in process (tests/unit); what only the workers do, in test_native.py."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
from helpers import (
    SENTENCES,
    as_sent,
    free_port,
    reference_embeddings,
    run_cli,
    wait_for,
    write_spec,
)

from neuronserve.runtime import Runner
from neuronserve.serve.deployment import running_workers
from neuronserve.serve.front import schemas
from neuronserve.serve.front.launch import WORKERS_DIR
from neuronserve.workers.store import models_in

pytestmark = pytest.mark.server

KEYS = ("secret-one", "secret-two")
LIMITS = {
    "max_body_bytes": 20_000,
    "max_client_batch": 16,
    "max_in_flight": 4,
    "deadline_s": 4,
}
LONG = " ".join(["long"] * 400)  # 402 tokens: over MiniLM's largest compiled 256


class Front:
    def __init__(self, work: Path, port: int, started: str):
        self.work, self.url, self.started = work, f"http://127.0.0.1:{port}", started
        self.auth = {"Authorization": f"Bearer {KEYS[1]}"}

    def post(self, path: str, body=None, key: bool = True, **kw) -> requests.Response:
        headers = {**(self.auth if key else {}), **kw.pop("headers", {})}
        return requests.post(f"{self.url}{path}", json=body, headers=headers, timeout=60, **kw)

    def get(self, path: str, key: bool = True) -> requests.Response:
        return requests.get(f"{self.url}{path}", headers=self.auth if key else {}, timeout=60)

    def workers(self):
        return running_workers(self.work / "front" / WORKERS_DIR)


@pytest.fixture(scope="module")
def front(tmp_path_factory, minilm_artifact, classifier_artifact, task_models):
    work = tmp_path_factory.mktemp("front")
    keys = work / "keys.txt"
    keys.write_text("# one key per line\n" + "\n".join(KEYS) + "\n")
    keys.chmod(0o600)
    port = free_port()
    write_spec(
        work,
        front_port=port,
        front_run_dir="front",
        auth="on",
        api_key_file=str(keys),
        workers=2,
        **LIMITS,
    )
    models = [minilm_artifact, task_models["rerank"][1], classifier_artifact]
    out = run_cli("serve", "front", *models, "--spec", "deploy.yaml", cwd=work)
    front = Front(work, port, out.stdout)
    yield front
    run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=work)
    assert front.workers() is None, "the workers outlived the front"


@pytest.fixture(scope="module")
def rerank_runner(task_models):
    return Runner(task_models["rerank"][1])


def runner_answer(runner, inputs, **parameters):
    body = {"inputs": inputs, "parameters": parameters} if parameters else {"inputs": inputs}
    return as_sent(runner.responses_for_bodies([(body, None)])[0])


def test_start_names_models_routes_and_the_key_file_never_a_key(front, tmp_path):
    assert "3 models on 2 worker(s), each holding them all" in front.started
    for line in ("minilm: feature-extraction", "rerank: rerank", "tiny-classifier: text-"):
        assert line in front.started, line
    assert "POST /v1/embeddings" in front.started and "POST /embed" in front.started
    assert "POST /predict" in front.started and "POST /rerank" in front.started
    assert "keys.txt" in front.started
    assert not any(k in front.started for k in KEYS)
    again = run_cli("serve", "front", "--spec", "deploy.yaml", cwd=front.work, check=False)
    assert again.returncode != 0 and "already running" in again.stderr


def test_openai_client(front, minilm_runner, minilm_dir):
    import openai
    from transformers import AutoTokenizer

    client = openai.OpenAI(base_url=f"{front.url}/v1", api_key=KEYS[0], max_retries=0)
    texts = SENTENCES[:10]
    want = np.array(runner_answer(minilm_runner, texts))
    # the client asks for base64 unless told otherwise, and decodes it itself
    got = client.embeddings.create(model="minilm", input=texts)
    assert [d.index for d in got.data] == list(range(len(texts)))
    assert np.allclose([d.embedding for d in got.data], want, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    assert got.usage.prompt_tokens == sum(len(tok(t)["input_ids"]) for t in texts)
    assert got.model == "minilm"

    assert [m.id for m in client.models.list()] == ["minilm", "rerank", "tiny-classifier"]
    floats = client.embeddings.create(model="minilm", input=texts[4], encoding_format="float")
    assert np.allclose(floats.data[0].embedding, want[4], atol=1e-5)

    cut = client.embeddings.create(model="minilm", input=texts[:3], dimensions=64)
    expect = want[:3, :64] / np.linalg.norm(want[:3, :64], axis=1, keepdims=True)
    assert np.allclose([d.embedding for d in cut.data], expect, atol=1e-5)
    assert all(len(d.embedding) == 64 for d in cut.data)


def test_openai_errors_in_openai_shape(front):
    import openai

    def client(key: str):
        return openai.OpenAI(base_url=f"{front.url}/v1", api_key=key, max_retries=0)

    with pytest.raises(openai.AuthenticationError):
        client("wrong").embeddings.create(model="minilm", input="x")
    with pytest.raises(openai.UnprocessableEntityError, match="more than this model's 384"):
        client(KEYS[0]).embeddings.create(model="minilm", input="x", dimensions=1000)
    with pytest.raises(openai.APIStatusError, match="max_client_batch") as e:
        client(KEYS[0]).embeddings.create(model="minilm", input=["x"] * 17)
    assert e.value.status_code == 422  # as text-embeddings-inference answers it
    with pytest.raises(openai.NotFoundError, match="served: minilm, rerank, tiny-classifier"):
        client(KEYS[0]).embeddings.create(model="text-embedding-3-small", input="x")
    r = front.post("/v1/embeddings", {"input": [1.5, 2], "model": "minilm"})
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("input")
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_tei_routes(front, minilm_runner, minilm_dir):
    from tokenizers import Tokenizer

    want = np.array(runner_answer(minilm_runner, SENTENCES[4:8]))
    one = front.post("/embed", {"inputs": SENTENCES[4]})
    assert one.status_code == 200 and np.allclose(one.json(), want[:1], atol=1e-5)
    many = front.post("/embed", {"inputs": SENTENCES[4:8], "normalize": True})
    assert np.allclose(schemas.EmbedResponse.model_validate(many.json()).root, want, atol=1e-5)
    cut = front.post("/embed", {"inputs": SENTENCES[4:6], "dimensions": 32, "normalize": True})
    expect = want[:2, :32] / np.linalg.norm(want[:2, :32], axis=1, keepdims=True)
    assert np.allclose(cut.json(), expect, atol=1e-5)
    # normalize: false, as text-embeddings-inference answers it: the pooled vector as the
    # model computes it (eager transformers, not normalised), its direction the same
    raw = front.post("/embed", {"inputs": SENTENCES[4:6], "normalize": False})
    assert raw.status_code == 200, raw.text
    got = np.array(raw.json())
    eager = reference_embeddings(minilm_dir, SENTENCES[4:6], normalize=False)
    assert np.allclose(got, eager, atol=1e-4 * np.abs(eager).max())
    assert not np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-2)
    assert np.allclose(got / np.linalg.norm(got, axis=1, keepdims=True), want[:2], atol=1e-5)

    text = SENTENCES[5]  # unicode, CJK and emoji
    tokens = front.post("/tokenize", {"inputs": [text, "hello"], "model": "minilm"}).json()
    tok = Tokenizer.from_file(str(Path(minilm_dir) / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    assert [t["id"] for t in tokens[0]] == tok.encode(text).ids
    words = [t for t in tokens[0] if not t["special"]]
    assert all(text[t["start"] : t["stop"]] == t["text"] for t in words)
    assert tokens[0][0]["special"] and tokens[0][0]["start"] is None

    info = schemas.Info.model_validate(front.get("/info").json())
    assert (info.task, info.max_input_length) == ("feature-extraction", 256)
    assert info.max_client_batch_size == 16 and info.truncation is False
    assert [(m["model_id"], m["task"]) for m in info.models] == [
        ("minilm", "feature-extraction"),
        ("rerank", "rerank"),
        ("tiny-classifier", "text-classification"),
    ]
    health = front.get("/health", key=False)
    assert health.status_code == 200
    assert schemas.Health.model_validate(health.json()).workers_ready == 2
    assert front.get("/predict").status_code == 405
    wrong_task = front.post("/predict", {"inputs": "x", "model": "minilm"})
    assert wrong_task.status_code == 424 and wrong_task.json()["error_type"] == "Backend"


def test_each_model_answers_as_it_would_alone(
    front, minilm_runner, classifier_runner, rerank_runner
):
    """Three tasks on the same workers, each answering as its Runner alone does (the
    routes find the model by task when the request names none)."""
    embed = front.post("/embed", {"inputs": SENTENCES[4]})
    assert embed.json() == [runner_answer(minilm_runner, SENTENCES[4])]
    texts = ["fine", "awful", "ok"]  # three texts (two would be one pair, TEI's rule)
    predict = front.post("/predict", {"inputs": texts, "model": "tiny-classifier"})
    want = runner_answer(classifier_runner, texts, top_k=None)
    assert predict.status_code == 200 and predict.json() == want
    docs = ["Paris is in France.", "naïve café 🎉", "Zürich has a lake."]
    ranked = front.post("/rerank", {"query": "where is Paris?", "texts": docs, "return_text": True})
    assert ranked.status_code == 200, ranked.text
    native = rerank_runner.responses_for_bodies(
        [
            (
                {
                    "query": "where is Paris?",
                    "documents": docs,
                    "parameters": {"return_documents": True},
                },
                None,
            )
        ]
    )[0]
    assert [(r["index"], r["score"], r["text"]) for r in ranked.json()] == [
        (n["index"], n["score"], n["document"]) for n in native
    ]


def test_huggingface_inference_client(front, minilm_runner):
    from huggingface_hub import InferenceClient

    # what LangChain's HuggingFaceEndpointEmbeddings and others use against a TEI server
    client = InferenceClient(model=f"{front.url}/embed", token=KEYS[0])
    got = client.feature_extraction(SENTENCES[4:7])
    assert np.allclose(got, runner_answer(minilm_runner, SENTENCES[4:7]), atol=1e-5)
    cut = client.feature_extraction(SENTENCES[4], dimensions=16)
    assert cut.shape == (1, 16) and np.isclose(np.linalg.norm(cut), 1.0, atol=1e-5)


def test_keys_are_required_except_on_probes(front):
    for path in ("/embed", "/v1/embeddings", "/tokenize", "/invocations"):
        r = front.post(path, {"inputs": "x"}, key=False)
        assert r.status_code == 401, path
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert "error" in front.post("/v1/embeddings", {"input": "x"}, key=False).json()
    for path in ("/info", "/metrics"):
        assert front.get(path, key=False).status_code == 401, path
    wrong = requests.post(
        f"{front.url}/embed", json={"inputs": "x"}, headers={"Authorization": "Basic c2VjcmV0"}
    )
    assert wrong.status_code == 401
    for path in ("/health", "/ping", "/openapi.json", "/docs"):
        assert front.get(path, key=False).status_code == 200, path
    first_key = requests.post(
        f"{front.url}/embed", json={"inputs": "x"}, headers={"Authorization": f"Bearer {KEYS[0]}"}
    )
    assert first_key.status_code == 200


def test_limits_refuse_one_request_and_serve_the_next(front, minilm_runner):
    big = front.post("/embed", {"inputs": ["x" * 1000] * 30})  # Content-Length over 20,000
    assert big.status_code == 413 and "max_body_bytes" in big.json()["error"]

    def chunks():  # no Content-Length: the limit is found while reading
        for _ in range(30):
            yield b" " * 1000
        yield b'{"inputs": "x"}'

    chunked = front.post("/embed", data=chunks(), headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413 and "max_body_bytes" in chunked.json()["error"]

    batch = front.post("/embed", {"inputs": ["x"] * 17})
    assert batch.status_code == 422 and "at most 16 (max_client_batch)" in batch.json()["error"]
    # SageMaker's route answers a request over a limit 413
    worker = front.post(
        "/invocations", {"inputs": ["x"] * 17}, headers={"X-Amzn-SageMaker-Target-Model": "minilm"}
    )
    assert worker.status_code == 413 and "max_client_batch" in worker.json()["error"]

    broken = front.post("/embed", data=b'{"inputs": ', headers={"Content-Type": "application/json"})
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]
    typed = front.post("/embed", {"inputs": "x", "truncate": "yes"})
    assert typed.status_code == 422 and typed.json()["error"].startswith("truncate")
    unknown = front.post("/embed", {"inputs": "x", "pooling": "cls"})
    assert unknown.status_code == 422 and "pooling" in unknown.json()["error"]
    ok = front.post("/embed", {"inputs": "hello"})
    assert ok.status_code == 200
    assert np.allclose(ok.json()[0], runner_answer(minilm_runner, "hello"), atol=1e-5)


def test_over_long_text_is_refused_unless_the_request_asks_to_cut_it(front, minilm_runner):
    refused = front.post("/embed", {"inputs": LONG})
    assert refused.status_code == 422 and "402 tokens" in refused.json()["error"]
    for direction in ("right", "left"):
        r = front.post(
            "/embed",
            {"inputs": [LONG + " end"], "truncate": True, "truncation_direction": direction},
        )
        want = runner_answer(
            minilm_runner, [LONG + " end"], truncate=True, truncation_direction=direction
        )
        assert r.status_code == 200 and np.allclose(r.json(), want, atol=1e-5), direction
    right = runner_answer(minilm_runner, "start " + LONG, truncate=True)
    left = runner_answer(minilm_runner, "start " + LONG, truncate=True, truncation_direction="left")
    assert not np.allclose(right, left, atol=1e-3)  # the two ends really differ


def test_a_burst_beyond_the_in_flight_bound_gets_429_and_the_rest_answers(front, minilm_runner):
    # 24 sent at once overflow 4 in flight; the 4 admitted (32 texts) are far from the
    # deadline even on a loaded host (64 texts once took 4 s on two busy cores)
    texts = [SENTENCES[8]] * 8
    want = np.array(runner_answer(minilm_runner, texts[:1]))
    barrier = threading.Barrier(24)

    def one(_):
        barrier.wait()
        return front.post("/embed", {"inputs": texts})

    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(one, range(24)))
    busy = [r for r in answers if r.status_code == 429]
    served = [r for r in answers if r.status_code == 200]
    assert busy and served and len(busy) + len(served) == 24, [r.status_code for r in answers]
    assert all(r.headers["Retry-After"] == "1" for r in busy)
    assert busy[0].json()["error_type"] == "Overloaded"
    assert all(np.allclose(r.json()[0], want[0], atol=1e-5) for r in served)


def test_the_deadline_answers_504_and_the_workers_serve_again(front):
    # the workers frozen: nothing answers until the front gives up (and the supervisor
    # may take them for hung and replace them)
    pids = [w["pid"] for w in front.workers().states()]
    frozen = [psutil.Process(pid) for pid in pids]
    for p in frozen:
        p.suspend()
    try:
        late = front.post("/embed", {"inputs": "frozen"})
    finally:
        for p in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()
    assert late.status_code == 504 and "deadline_s" in late.json()["error"]
    wait_for(lambda: front.post("/embed", {"inputs": "awake"}).status_code == 200, 30)


def test_metrics_count_routes_and_show_the_workers_by_model(front):
    front.post("/embed", {"inputs": "counted"})
    front.post("/predict", {"inputs": "counted"})
    front.post("/embed", {"inputs": "refused"}, key=False)
    text = front.get("/metrics").text
    assert 'neuronserve_front_requests_total{model="minilm",route="/embed",status="200"}' in text
    assert 'neuronserve_front_requests_total{model="",route="/embed",status="401"}' in text
    assert "neuronserve_front_request_duration_seconds_bucket" in text
    assert "neuronserve_front_in_flight 0.0" in text
    # the workers' own series, one per model, behind the front's
    wait_for(lambda: 'model="tiny-classifier"' in front.get("/metrics").text, 10, 0.1, "metrics")
    assert re.search(r'neuronserve_requests_total\{[^}]*model="minilm"', front.get("/metrics").text)


def _traffic(front):
    """minilm's traffic as the front reports it, or None before the workers' rows are in."""
    from neuronserve import traffic

    try:
        return traffic.read(front.get("/metrics").text, "minilm")
    except ValueError:
        return None


def _settled(front, more_than: float = -1.0):
    """minilm's traffic once the workers' rows exceed `more_than` and have held still for
    0.2 s: a worker reports a batch's rows after its answers (they go out first), so the
    series may trail a response by a moment."""
    first_read: dict[float, float] = {}  # each rows total, when it was first read

    def held():
        now = _traffic(front)
        if now is None or now.rows.total <= more_than:
            return None
        since = first_read.setdefault(now.rows.total, time.monotonic())
        return now if time.monotonic() - since >= 0.2 else None

    return wait_for(held, 10, 0.05, f"the workers' rows to settle above {more_than}")


def test_metrics_hold_what_tune_reads_back(front, minilm_dir, minilm_artifact):
    """Each text's tokens (the front's) and each device call's rows (the workers'), as
    `neuronserve tune` reads them: the difference one request makes."""
    from transformers import AutoTokenizer

    from neuronserve import traffic

    assert front.post("/embed", {"inputs": "so that the series exist"}).status_code == 200
    before = _settled(front)
    texts = ["one", "a somewhat longer text of a dozen words or so, for the histogram", "x y"]
    assert front.post("/embed", {"inputs": texts}).status_code == 200
    after = _settled(front, before.rows.total)
    lengths = [len(ids) for ids in AutoTokenizer.from_pretrained(minilm_dir)(texts)["input_ids"]]
    assert after.tokens.total - before.tokens.total == sum(lengths)
    bound = [next(b for b in traffic.TOKEN_BUCKETS if n <= b) for n in lengths]
    grew = {
        b: d
        for b, n in after.tokens.by_bound.items()
        if (d := n - before.tokens.by_bound.get(b, 0))
    }
    assert grew == {b: bound.count(b) for b in bound}
    assert after.rows.total - before.rows.total == len(texts)  # every text a row of a call
    # and `neuronserve tune` reads them so, with the key from the environment
    env = {**os.environ, "NEURONSERVE_API_KEY": KEYS[1]}
    out = run_cli("tune", minilm_artifact, "--url", front.url, env=env).stdout
    assert "traffic of minilm at" in out and re.search(r"^proposed\s+[\d, ]*256\s", out, re.M), out
    refused = run_cli("tune", minilm_artifact, "--url", front.url, check=False,
                      env={**os.environ, "NEURONSERVE_API_KEY": "wrong"})  # fmt: skip
    assert refused.returncode == 1 and "401" in refused.stderr, refused.stderr


def test_the_front_process_never_loads_torch(front):
    """It parses JSON and forwards it: torch is the workers'. Read from the running
    process's memory map, not from an import in this one."""
    pid = int((front.work / "front" / "front.pid").read_text())
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "libtorch" not in maps and "torch/lib" not in maps


def test_openapi_document_lists_every_route_from_the_request_models(front):
    doc = front.get("/openapi.json", key=False).json()
    for path in ("/v1/embeddings", "/embed", "/predict", "/rerank", "/tokenize", "/info",
                 "/health", "/ping", "/invocations", "/metrics"):  # fmt: skip
        assert path in doc["paths"], path
    body = doc["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]
    name = body["schema"]["$ref"].rsplit("/", 1)[-1]
    assert "truncation_direction" in doc["components"]["schemas"][name]["properties"]
    assert doc["paths"]["/embed"]["post"]["security"] == [{"bearer": []}]
    assert "swagger-ui" in front.get("/docs", key=False).text


def test_an_idle_connection_outlives_the_retry_after(front):
    """A client told Retry-After: 5 that waits and then reuses its connection must find
    it open: a front that closes it at that moment loses the request sent on it."""
    import http.client
    import socket

    from neuronserve.serve.front.routes import RETRY_AFTER_S

    headers = {**front.auth, "Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", int(front.url.rsplit(":", 1)[1]), timeout=30)
    try:
        conn.request("POST", "/embed", b'{"inputs": "kept alive"}', headers)
        first = conn.getresponse()
        assert first.status == 200 and first.read()
        sock = conn.sock
        # the idle time is what is tested: nothing to poll for
        time.sleep(float(RETRY_AFTER_S) + 1)
        # a connection the front closed reads as end of stream at once
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(1, socket.MSG_PEEK)
        sock.settimeout(30)
        conn.request("POST", "/embed", b'{"inputs": "kept alive"}', headers)
        assert conn.sock is sock, "http.client opened a new connection"
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_the_run_directory_serves_another_model_after_a_stop(
    front, classifier_runner, classifier_artifact
):
    """Last in the module: stop, then serve another artifact from the same run directory.
    Only it is loaded: nothing packaged for the earlier start comes back."""
    run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=front.work)
    out = run_cli("serve", "front", classifier_artifact, "--spec", "deploy.yaml", cwd=front.work)
    assert "tiny-classifier (text-classification" in out.stdout
    info = front.get("/info").json()
    assert [m["model_id"] for m in info["models"]] == ["tiny-classifier"]
    r = front.post("/predict", {"inputs": "works"})
    assert r.status_code == 200 and r.json() == runner_answer(
        classifier_runner, "works", top_k=None
    )
    assert front.post("/embed", {"inputs": "gone"}).status_code == 424
    assert models_in(front.work / "front" / WORKERS_DIR / "store") == ["tiny-classifier"]


def test_stop_stops_what_a_front_that_died_left_running(front):
    """Last: a front killed outright (no drain, no stop of its workers) may leave its
    workers serving; `--stop` stops them too."""
    pid = int((front.work / "front" / "front.pid").read_text())
    root = psutil.Process(pid)
    root.kill()
    wait_for(lambda: not root.is_running() or root.status() == psutil.STATUS_ZOMBIE, 30)
    left = front.workers()
    out = run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=front.work)
    if left is not None:
        assert "the front left its workers running" in out.stdout
    assert front.workers() is None, "the workers outlived their front's stop"
