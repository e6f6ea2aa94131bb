"""The front in front of a real tritonserver serving three models of three tasks (a
cross-encoder: a tiny random BERT classifier with one label; MiniLM embeddings; the tiny
three-label classifier), over TLS on every address, so a key is generated (auth: auto),
with client batches split into pieces: /rerank and /predict against the eager model,
/embed and /invocations against the Runners and Triton asked directly, truncation carried
in Triton's request parameters, a killed instance replaced alone with all its models. Last: the
run directory serves another model after a stop."""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import json
import os
import signal
import stat
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
import torch
from helpers import free_port, run_cli, tiny_bert_classifier, wait_for, write_spec
from tritonclient.utils import InferenceServerException

from neuronserve.engines.triton.stubs import live_stubs
from neuronserve.processes import live_pid
from neuronserve.serve.deployment import running_engine
from neuronserve.serve.front import schemas
from neuronserve.serve.front.launch import ENGINE_DIR

pytestmark = pytest.mark.server

QUERY = "how do I reset my password?"
DOCS = [
    "Open settings and choose reset password.",
    "The store opens at nine on Sundays.",
    "Passwords can be changed from the login page.",
    "Lisbon is sunny today.",
    "Ünïcödé façade 🚀",
    "x",
    " ".join(["account"] * 20),
]
LONG = " ".join(["long"] * 100)  # over the largest compiled sequence (64) with the query


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory, minilm_dir) -> Path:
    """A cross-encoder shape: one label."""
    return tiny_bert_classifier(
        tmp_path_factory.mktemp("tiny-reranker"), minilm_dir, seed=1, num_labels=1
    )


@pytest.fixture(scope="module")
def reranker_artifact(tmp_path_factory, reranker_dir) -> Path:
    from neuronserve.compile import compile_model
    from neuronserve.spec import load_spec

    spec = {
        "artifact": tmp_path_factory.mktemp("artifacts") / "reranker",
        "model": reranker_dir,
        "task": "text-classification",
        "batch_sizes": [1, 4],
        "sequence_lengths": [16, 64],
        "precision": "fp32",
        "truncation": False,
    }
    return compile_model(load_spec(None, spec), progress=False)


def eager_logits(model_dir: Path, pairs: list) -> np.ndarray:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return np.array(
            [
                model(**tok(*(p if isinstance(p, tuple) else (p,)), return_tensors="pt"))
                .logits[0, 0]
                .item()
                for p in pairs
            ]
        )


def sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x, dtype=np.float64)))


def self_signed(work: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = work / "cert.pem", work / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def engine_routes(front, model: str = "models"):
    """The engine's own routes (protocol, url, model, headers) behind `front`."""
    return running_engine(front.work / "front" / ENGINE_DIR, "triton").instance.native_routes(model)


class Front:
    def __init__(self, work: Path, port: int, cert: Path, key: str):
        self.work, self.cert = work, cert
        self.url = f"https://127.0.0.1:{port}"
        self.auth = {"Authorization": f"Bearer {key}"}

    def post(self, path: str, body, key: bool = True) -> requests.Response:
        headers = self.auth if key else {}
        return requests.post(
            f"{self.url}{path}", json=body, headers=headers, verify=self.cert, timeout=60
        )

    def get(self, path: str, key: bool = True) -> requests.Response:
        headers = self.auth if key else {}
        return requests.get(f"{self.url}{path}", headers=headers, verify=self.cert, timeout=60)

    def engine(self):
        running = running_engine(self.work / "front" / ENGINE_DIR, "triton")
        return running.instance if running is not None else None


@pytest.fixture(scope="module")
def front(tmp_path_factory, reranker_artifact, minilm_artifact, classifier_artifact):
    work = tmp_path_factory.mktemp("front-triton")
    cert, key = self_signed(work)
    port = free_port()
    write_spec(
        work,
        engine="triton",
        front_address="0.0.0.0",  # beyond loopback: keys on, one generated
        front_port=port,
        front_run_dir="front",
        tls_cert=str(cert),
        tls_key=str(key),
        max_client_batch=4,
        split_client_batches=True,
        workers=2,
    )
    env = {k: v for k, v in os.environ.items() if k != "NEURONSERVE_API_KEY"}
    models = [reranker_artifact, minilm_artifact, classifier_artifact]
    out = run_cli("serve", "front", *models, "--spec", "deploy.yaml", cwd=work, env=env)
    key_file = work / "front" / "api_key"
    generated = key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert str(key_file) in out.stdout and generated not in out.stdout
    front = Front(work, port, cert, generated)
    front.env = env
    yield front
    run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=work, env=env)
    assert front.engine() is None


def test_tls_and_the_generated_key(front):
    engine = front.engine()
    assert engine.http_url.startswith("http://127.0.0.1:")  # the front is public, not Triton
    assert front.get("/health", key=False).status_code == 200
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(front.url.replace("https", "http") + "/health", timeout=10)
    assert front.get("/info", key=False).status_code == 401
    info = schemas.Info.model_validate(front.get("/info").json())
    assert (info.engine, info.task, info.model_type) == (
        "triton",
        "text-classification",
        # one label: a cross-encoder, TEI's reranker
        {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}},
    )


def test_rerank_ranks_like_the_eager_model(front, reranker_dir):
    logits = eager_logits(reranker_dir, [(QUERY, d) for d in DOCS])
    # the one cross-encoder of the three: found without being named
    r = front.post("/rerank", {"query": QUERY, "texts": DOCS, "return_text": True})
    assert r.status_code == 200, r.text
    ranks = schemas.RerankResponse.model_validate(r.json()).root
    assert [x.index for x in ranks] == list(np.argsort(-logits, kind="stable"))
    assert np.allclose(
        [x.score for x in ranks], sigmoid(logits[[x.index for x in ranks]]), atol=1e-4
    )
    assert all(x.text == DOCS[x.index] for x in ranks)  # 7 documents: over 4, sent in pieces

    top = front.post("/rerank", {"query": QUERY, "texts": DOCS, "top_n": 2, "raw_scores": True})
    best = np.argsort(-logits, kind="stable")[:2]
    assert [x["index"] for x in top.json()] == list(best)
    assert np.allclose([x["score"] for x in top.json()], logits[best], atol=1e-4)
    assert "text" not in top.json()[0]
    empty = front.post("/rerank", {"query": QUERY, "texts": []})
    assert empty.status_code == 400 and empty.json()["error_type"] == "Empty"


def test_predict_takes_texts_and_pairs_the_tei_way(front, reranker_dir):
    items = [[QUERY, DOCS[0]], "a single text", [DOCS[1], DOCS[2]], DOCS[4]]
    want = eager_logits(reranker_dir, [tuple(i) if isinstance(i, list) else i for i in items])
    batch = front.post("/predict", {"inputs": items, "model": "reranker"})
    assert batch.status_code == 200, batch.text
    got = [row[0]["score"] for row in batch.json()]
    assert np.allclose(got, sigmoid(want), atol=1e-4)
    assert {row[0]["label"] for row in batch.json()} == {"LABEL_0"}
    pair = front.post(
        "/predict", {"inputs": [QUERY, DOCS[0]], "raw_scores": True, "model": "reranker"}
    )
    assert np.isclose(pair.json()[0]["score"], want[0], atol=1e-4)  # one pair: one answer


def query_and_documents(client_module) -> list:
    """TEXT and TEXT_PAIR tensors of QUERY against the first four DOCS, for either of
    tritonclient's protocols."""
    tensors = []
    for name, values in (("TEXT", [QUERY] * 4), ("TEXT_PAIR", DOCS[:4])):
        t = client_module.InferInput(name, [4, 1], "BYTES")
        t.set_data_from_numpy(np.array([[v.encode()] for v in values], dtype=object))
        tensors.append(t)
    return tensors


def test_invocations_equal_triton_asked_directly(front):
    import tritonclient.http as httpclient

    pairs = [{"text": QUERY, "text_pair": d} for d in DOCS[:4]]
    ours = requests.post(
        f"{front.url}/invocations",
        json={"inputs": pairs, "parameters": {"top_k": None}},
        headers={**front.auth, "X-Amzn-SageMaker-Target-Model": "reranker"},
        verify=front.cert,
        timeout=60,
    )
    assert ours.status_code == 200, ours.text
    engine = front.engine()
    client = httpclient.InferenceServerClient(engine.http_url.removeprefix("http://"))
    try:
        inputs = query_and_documents(httpclient)
        # behind the front, Triton's inference takes the key the front holds: another
        # local user who finds the port gets nothing around the front's keys
        with pytest.raises(InferenceServerException) as refused:
            client.infer("models", inputs, parameters={"model": "reranker"})
        assert "restricted" in str(refused.value).lower() or refused.value.status() in (
            "401",
            "403",
        ), str(refused.value)
        logits = client.infer(
            "models", inputs, parameters={"model": "reranker"}, headers=engine.headers()
        )
        logits = logits.as_numpy("LOGITS")[:, 0]
    finally:
        client.close()
    assert np.allclose([row[0]["score"] for row in ours.json()], sigmoid(logits), atol=1e-6)
    # and over gRPC, as the engine's native route gives it (its header, gRPC's way)
    import tritonclient.grpc as grpcclient

    (route,) = [r for r in engine_routes(front) if r.protocol == "triton-grpc"]
    channel = grpcclient.InferenceServerClient(route.url)
    try:
        tensors = query_and_documents(grpcclient)
        with pytest.raises(InferenceServerException, match="restricted"):
            channel.infer("models", tensors, parameters={"model": "reranker"})
        got = channel.infer("models", tensors, parameters={"model": "reranker"},
                            headers=route.headers)  # fmt: skip
        assert np.allclose(got.as_numpy("LOGITS")[:, 0], logits, atol=1e-6)
    finally:
        channel.close()


def test_each_model_answers_as_it_would_alone(front, minilm_runner, classifier_runner):
    texts = ["first text", "zweiter Text", "東京"]
    embed = front.post("/embed", {"inputs": texts})
    want = minilm_runner.responses_for_bodies([({"inputs": texts}, None)])[0]
    assert embed.status_code == 200 and np.allclose(embed.json(), want, atol=1e-6)
    labels = front.post("/predict", {"inputs": texts, "model": "tiny-classifier"})
    body = {"inputs": texts, "parameters": {"top_k": None}}
    native = classifier_runner.responses_for_bodies([(body, None)])[0]
    assert [[x["label"] for x in row] for row in labels.json()] == [
        [x["label"] for x in row] for row in native
    ]
    assert np.allclose(
        [[x["score"] for x in row] for row in labels.json()],
        [[x["score"] for x in row] for row in native],
        atol=1e-6,
    )


def test_routes_say_which_model_fits(front):
    tei = front.post("/embed", {"inputs": "x", "model": "reranker"})
    assert tei.status_code == 424 and "reranker is text-classification" in tei.json()["error"]
    openai = front.post("/v1/embeddings", {"input": "x", "model": "reranker"})
    assert openai.status_code == 424 and "feature-extraction" in openai.json()["error"]["message"]
    two = front.post("/predict", {"inputs": "x"})  # two classifiers: which one?
    assert two.status_code == 422 and "reranker, tiny-classifier" in two.json()["error"]


def test_truncation_travels_in_triton_request_parameters(front, reranker_artifact):
    from neuronserve.runtime import Runner

    refused = front.post("/predict", {"inputs": [QUERY, LONG], "model": "reranker"})
    assert refused.status_code == 422 and "tokens long" in refused.json()["error"], refused.text
    cut = front.post(
        "/predict",
        {"inputs": [QUERY, LONG], "truncate": True, "raw_scores": True, "model": "reranker"},
    )
    assert cut.status_code == 200, cut.text
    runner = Runner(reranker_artifact, warmup=False)
    body = {
        "inputs": {"text": QUERY, "text_pair": LONG},
        "parameters": {"truncate": True, "function_to_apply": "none"},
    }
    want = runner.responses_for_bodies([(body, None)])[0]
    assert np.isclose(cut.json()[0]["score"], want[0]["score"], atol=1e-5)


def test_health_and_the_engines_metrics(front):
    health = front.get("/health", key=False).json()
    assert health == {"status": "ok", "workers_ready": 2, "workers_expected": 2}
    assert front.post("/rerank", {"query": QUERY, "texts": DOCS}).status_code == 200
    text = front.get("/metrics").text
    assert "nv_inference_request_success" in text
    assert 'neuronserve_front_requests_total{model="reranker",route="/rerank",status="200"}' in text


def test_a_killed_stub_is_replaced_alone_while_the_other_serves(front):
    """Kill one instance's stub: every request meanwhile is answered (the other instance
    serves on, and the front sends a request whose stub died once more), /health says
    200 `degraded` with the counts, and the healer replaces that instance alone, on the
    cores it held, with every model, within 30 s."""
    engine = front.engine()
    victim, other = live_stubs(engine.pid)["models"]
    cores = victim.cpu_affinity()
    seen_health: list[tuple[int, str, int]] = []
    statuses: list[int] = []
    stop = threading.Event()

    def watch_health():
        while not stop.is_set():
            health = front.get("/health", key=False)
            body = health.json()
            seen_health.append((health.status_code, body["status"], body["workers_ready"]))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch_health)
    watcher.start()
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    try:
        while time.monotonic() - killed < 30:
            r = front.post("/predict", {"inputs": "still there?", "model": "reranker"})
            statuses.append(r.status_code)
            healed = seen_health and seen_health[-1][1] == "ok"
            if healed and (200, "degraded", 1) in seen_health:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        watcher.join()
    # what /health said, in runs (the list itself is too long for a failure's message)
    runs = [(k, len(list(g))) for k, g in itertools.groupby(seen_health)]
    stubs_now = [p.pid for p in live_stubs(engine.pid)["models"]]
    said = (runs, victim.pid, stubs_now, (engine.run_dir / "healer.log").read_text()[-2000:])
    assert (200, "degraded", 1) in seen_health, said
    assert {s for s, _, _ in seen_health} == {200}, said
    assert set(statuses) == {200}, statuses
    assert time.monotonic() - killed < 30
    now = {p.pid: p for p in live_stubs(engine.pid)["models"]}
    assert other.pid in now and victim.pid not in now and len(now) == 2
    [new] = [p for pid, p in now.items() if pid != other.pid]
    assert new.cpu_affinity() == cores  # the freed core group
    state = json.loads((engine.run_dir / "instances.json").read_text())["models"]
    assert state["replacements"] == 1 and state["state"] == "serving" and state["alive"] == 2
    assert "of models replaced" in (engine.run_dir / "healer.log").read_text()
    sequential = [
        front.post("/predict", {"inputs": f"text {i}", "model": "reranker"}).status_code
        for i in range(20)
    ]
    assert sequential == [200] * 20
    # replaced with every model
    assert front.post("/embed", {"inputs": "healed"}).status_code == 200
    assert front.post("/predict", {"inputs": "x", "model": "tiny-classifier"}).status_code == 200


def test_a_model_only_a_restart_can_mend_makes_the_front_restart_triton(front):
    """The healer says a model is wedged (Triton can no longer update it: a stub killed
    while it sent a response, which test_neuron.py meets now and then; stood in for here
    by the healer paused and its status written as it writes a wedge): the front restarts
    tritonserver, says `loading` on /health meanwhile, and the models answer again from
    new processes."""
    engine = front.engine()
    old = {engine.pid, *(p.pid for p in live_stubs(engine.pid)["models"])}
    healer = live_pid(engine.run_dir / "healer.pid")
    os.kill(healer, signal.SIGSTOP)
    status = engine.run_dir / "instances.json"
    state = json.loads(status.read_text())
    state["models"].update(state="wedged", last_error="Triton did not take cores1_0 out in 30s")
    status.write_text(json.dumps(state))
    seen: list[tuple[int, str]] = []

    def restarted() -> bool:
        health = front.get("/health", key=False)
        seen.append((health.status_code, health.json()["status"]))
        now = front.engine()
        return now is not None and now.pid not in old and seen[-1] == (200, "ok")

    wait_for(restarted, timeout=180, interval=0.2, what="tritonserver restarted")
    assert (503, "loading") in seen, seen
    log = (front.work / "front" / "front.log").read_text()
    assert "restarting triton: models: Triton did not take cores1_0 out" in log
    assert not [pid for pid in old | {healer} if psutil.pid_exists(pid)]
    assert not front.engine().wedged()  # a new healer, a new status
    assert front.post("/embed", {"inputs": "mended"}).status_code == 200
    assert front.post("/predict", {"inputs": "x", "model": "tiny-classifier"}).status_code == 200


def test_the_run_directory_serves_another_model_after_a_stop(front, tiny_artifact, tiny_runner):
    """Last in the module: stop, then serve another artifact from the same run directory.
    Only it is loaded: nothing packaged for the earlier start comes back."""
    run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=front.work, env=front.env)
    run_cli("serve", "front", tiny_artifact, "--spec", "deploy.yaml", cwd=front.work, env=front.env)
    assert [m["model_id"] for m in front.get("/info").json()["models"]] == ["tiny"]
    r = front.post("/embed", {"inputs": "works"})
    want = tiny_runner.responses_for_bodies([({"inputs": "works"}, None)])[0]
    assert r.status_code == 200 and np.allclose(r.json(), [want], atol=1e-6)
    assert front.post("/rerank", {"query": "q", "texts": ["a"]}).status_code == 424
    store = front.work / "front" / ENGINE_DIR / "store"
    assert sorted(p.name for p in store.iterdir()) == ["tiny"]


def test_a_crashed_tritonserver_leaves_no_stub_holding_its_cores(front, tiny_runner):
    """Last: tritonserver killed outright (as when it aborts) leaves its stubs running,
    each holding its core group: the healer stops them, and the front starts the server
    again, which serves."""
    server = psutil.Process(front.engine().pid)
    stubs = [p for ps in live_stubs(server.pid).values() for p in ps]
    assert len(stubs) == 2
    server.kill()
    _, alive = psutil.wait_procs(stubs, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    # the front reaps the server it started: no zombie left for stubs to take as alive
    wait_for(lambda: not psutil.pid_exists(server.pid), timeout=10, what="the server reaped")

    def restarted() -> bool:
        now = front.engine()
        health = front.get("/health", key=False)
        return now is not None and now.pid != server.pid and health.status_code == 200

    wait_for(restarted, timeout=180, interval=0.2, what="tritonserver started again")
    log = (front.work / "front" / "front.log").read_text()
    assert "restarting triton: tritonserver is no longer running" in log
    r = front.post("/embed", {"inputs": "again"})
    want = tiny_runner.responses_for_bodies([({"inputs": "again"}, None)])[0]
    assert r.status_code == 200 and np.allclose(r.json(), [want], atol=1e-6)
