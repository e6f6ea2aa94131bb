"""A real TorchServe (Java frontend + Python workers), started as its users start it
(`torchserve --start` on the store `neuronserve package torchserve` wrote), serving one
deployment of every task: the real MiniLM model, the tiny classifier (its truncation
turned on at packaging), fill-mask, a reranker, NER, QA and two ViTs, packaged together
into one archive. Two workers, one per one-core group, each holding every model; token
authorization on; one server for the module. Requests name their model in the
X-Neuronserve-Model header, as a curl user sends them. Answers are compared with the
Runners in process and with the transformers pipelines."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
import yaml
from helpers import (
    LABELS,
    QA_CONTEXT,
    SENTENCES,
    as_sent,
    float32_in_fewest_digits,
    ports_for,
    qa_reference,
    run_cli,
    same_answers,
    wait_for,
)
from plugin_servers import start_torchserve, stop_torchserve

from neuronserve.cores import parse_core_list
from neuronserve.images import sample_images
from neuronserve.runtime import Runner
from neuronserve.worker import FAILURE_MARKER

pytestmark = pytest.mark.server
STACK = "stack"  # the one TorchServe model holding them all
MODELS = ["minilm", "tiny-classifier", "fill", "rerank", "ner", "qa", "labels", "features"]
TEXTS = ["Ana met Bob in Paris", "naïve café 🎉 in Zürich, said Ana.", "a", "東京 and São Paulo"]
LONG = (
    "Ünïcode 🎉 the quick brown fox jumps over the lazy dog near New York, then runs back "
    "home past Ana and Bob in Paris, Zürich and 東京 before it rests in São Paulo"
)
DOCS = ["Paris is in France.", "naïve café 🎉", "x", "Zürich has a lake.", "東京", "a b c"]
IMAGES = sample_images(5, seed=4)


class TorchServe:
    """What the tests ask of the TorchServe they started: its addresses and keys."""

    def __init__(self, started, store: Path, work: Path):
        self.started, self.log_dir = started, work / "logs"
        self.inference_url = started.url
        self.management_url = started.management
        props = (store / "config.properties").read_text()
        self.metrics_url = re.search(r"^metrics_address=(\S+)", props, re.M).group(1)

    def headers(self, api: str = "inference") -> dict[str, str]:
        return dict(self.started.manage_headers if api == "management" else self.started.headers)

    def workers(self, name: str) -> list[dict]:
        r = requests.get(
            f"{self.management_url}/models/{name}", headers=self.headers("management"), timeout=10
        )
        r.raise_for_status()
        return [w for entry in r.json() for w in entry.get("workers", [])]


def worker_failures(log_dir: Path) -> list[str]:
    """Lines in the model log where a worker said it could not start."""
    path = log_dir / "model_log.log"
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return [ln.split(FAILURE_MARKER)[-1].strip() for ln in lines if FAILURE_MARKER in ln]


@pytest.fixture(scope="module")
def server(tmp_path_factory, minilm_artifact, classifier_artifact, task_models, lease_dir):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPU cores for a two-group plan")
    work = tmp_path_factory.mktemp("torchserve")
    spec = {
        "models": [
            {"artifact": str(minilm_artifact)},
            # compiled with truncation off; packaged with it on for this model alone
            {"artifact": str(classifier_artifact), "truncation": True},
            *({"artifact": str(task_models[n][1])} for n in MODELS[2:]),
        ],
        "deployment_name": STACK,
        "worker": {"workers": 2, "cores_per_worker": 1, "max_batch_delay_ms": 100},
        "torchserve": {
            "model_store": "store",
            **ports_for(
                "inference_port",
                "management_port",
                "metrics_port",
                "grpc_inference_port",
                "grpc_management_port",
            ),
        },
    }
    (work / "deploy.yaml").write_text(yaml.safe_dump(spec))
    packaged = run_cli("package", "torchserve", "--spec", "deploy.yaml", cwd=work)
    assert "8 models" in packaged.stdout and "X-Neuronserve-Model" in packaged.stdout
    assert "torchserve --start --model-store" in packaged.stdout
    started = start_torchserve(work / "store", work / "run")
    pids = [psutil.Process(started.pid), *started.children()]
    try:
        yield TorchServe(started, work / "store", work / "run")
    finally:  # a fixture that fails after the start leaves no JVM behind either
        stop_torchserve(started, work / "run")
    assert not [p.pid for p in pids if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(scope="module")
def runners(task_models, minilm_runner, classifier_artifact):
    out = {"minilm": minilm_runner, "tiny-classifier": Runner(classifier_artifact, truncation=True)}
    out.update({n: Runner(task_models[n][1]) for n in MODELS[2:]})
    return out


def post(inst, model, body, content_type="application/json", path=f"predictions/{STACK}", **kw):
    data = json.dumps(body) if not isinstance(body, (bytes, str)) else body
    headers = {**inst.headers(), "Content-Type": content_type, **kw.pop("headers", {})}
    if model is not None:
        headers["X-Neuronserve-Model"] = model
    return requests.post(
        f"{inst.inference_url}/{path}", data=data, headers=headers, timeout=60, **kw
    )


def answer(runner, body, content_type=None):
    [got] = runner.responses_for_bodies([(body, content_type)])
    return as_sent(got)


def ready_workers(inst) -> list[dict]:
    return [w for w in inst.workers(STACK) if w["status"] == "READY"]


def worker_affinity(pid: int) -> dict[int, list[int]]:
    """Allowed CPUs of every thread of a process, read from /proc."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        allowed = re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)
        out[int(tid)] = parse_core_list(allowed)
    return out


def lease_records(lease_dir: Path) -> dict[int, dict]:
    recs = {}
    for f in lease_dir.glob("cpu-core-*.lock"):
        rec = json.loads(f.read_text() or "{}")
        if rec:
            recs[rec["pid"]] = rec
    return recs


def loaded_by(inst, pid: int) -> str:
    """The line worker `pid` logged once it had loaded and warmed up its models."""
    log = (inst.log_dir / "model_log.log").read_text()
    lines = [ln for ln in log.splitlines() if f"neuronserve: pid {pid} leased" in ln]
    assert lines, f"no start line of worker {pid}"
    return lines[-1]


def test_two_workers_each_hold_every_model(server):
    workers = server.workers(STACK)
    assert len(workers) == 2 and all(w["status"] == "READY" for w in workers)
    for w in workers:
        line = loaded_by(server, int(w["pid"]))
        assert all(f"{m}: buckets" in line for m in MODELS), line


def test_token_auth_is_on(server):
    r = requests.post(
        f"{server.inference_url}/predictions/{STACK}", json={"inputs": "x"}, timeout=30
    )
    assert r.status_code in (400, 401, 403)
    assert post(server, "minilm", {"inputs": "x"}).status_code == 200


def test_a_request_names_its_model(server):
    unknown = post(server, "nope", {"inputs": "x"})
    assert unknown.status_code == 404
    assert unknown.json()["error"] == f"no model 'nope' here; served: {', '.join(MODELS)}"
    unnamed = post(server, None, {"inputs": "x"})
    assert unnamed.status_code == 400 and "X-Neuronserve-Model" in unnamed.json()["error"]
    # the other models keep answering
    assert post(server, "minilm", {"inputs": "x"}).status_code == 200


def test_answers_equal_the_runners(server, runners):
    # sequential requests form the same batches in both: the same numbers, bit for bit
    for text in SENTENCES:
        r = post(server, "minilm", {"inputs": text})
        assert r.status_code == 200, r.text
        assert r.json() == answer(runners["minilm"], {"inputs": text}), text
        assert float32_in_fewest_digits(r.content)
    r = post(server, "minilm", {"inputs": SENTENCES})
    assert r.json() == answer(runners["minilm"], {"inputs": SENTENCES})


def test_plain_text_and_multipart_bodies(server):
    want = post(server, "minilm", {"inputs": "How do I reset my password?"}).json()
    plain = post(server, "minilm", "How do I reset my password?", content_type="text/plain")
    multipart = requests.post(
        f"{server.inference_url}/predictions/{STACK}",
        files={"data": (None, "How do I reset my password?")},
        headers={**server.headers(), "X-Neuronserve-Model": "minilm"},
        timeout=60,
    )
    assert plain.status_code == multipart.status_code == 200
    assert plain.json() == want == multipart.json()


def test_classifier_labels_scores_and_the_truncation_given_at_packaging(server, runners):
    texts = ["what a wonderful day", "this is awful", "ok", " ".join(["long"] * 40)]
    pairs = [{"text": "is the product good?", "text_pair": "it broke after a day"}]
    for body in (
        {"inputs": texts, "parameters": {"top_k": None}},
        {"inputs": pairs, "parameters": {"top_k": 3}},
        {"inputs": texts[0]},
    ):
        r = post(server, "tiny-classifier", body)
        assert r.status_code == 200, r.text
        assert r.json() == answer(runners["tiny-classifier"], body)
    one = post(server, "tiny-classifier", {"inputs": texts[0]}).json()
    assert len(one) == 1 and one[0]["label"] in LABELS  # top_k defaults to 1
    bad = post(server, "tiny-classifier", {"inputs": "x", "parameters": {"top_k": "all"}})
    assert bad.status_code == 400 and "top_k" in bad.json()["error"]
    # 102 tokens, the artifact holds 64: cut, since packaging turned truncation on for it
    body = {"inputs": [" ".join(["long"] * 100), "short"]}
    r = post(server, "tiny-classifier", body)
    assert r.status_code == 200 and r.json() == answer(runners["tiny-classifier"], body)
    # ... and for it alone: MiniLM, packaged beside it, still refuses over-long text
    assert post(server, "minilm", {"inputs": " ".join(["long"] * 400)}).status_code == 413


def test_fill_mask_and_rerank_equal_the_runners_and_the_pipelines(server, runners, task_models):
    from transformers import pipeline

    pipe = pipeline("fill-mask", model=str(task_models["fill"][0]))
    for body in (
        {"inputs": "Ana met [MASK] in Paris."},
        {"inputs": ["naïve [MASK] 🎉", "[MASK] and [MASK]"], "parameters": {"top_k": 3}},
    ):
        for path in (f"predictions/{STACK}", f"invocations?model_name={STACK}"):
            r = post(server, "fill", body, path=path)
            assert r.status_code == 200, r.text
            assert same_answers(r.json(), answer(runners["fill"], body), atol=1e-6)
            assert same_answers(r.json(), pipe(body["inputs"], **body.get("parameters", {})))
    body = {
        "query": "where is Paris?",
        "documents": DOCS,
        "parameters": {"top_n": 4, "return_documents": True},
    }
    for path in (f"predictions/{STACK}", f"invocations?model_name={STACK}"):
        r = post(server, "rerank", body, path=path)
        assert r.status_code == 200, r.text
        assert (
            same_answers(r.json(), answer(runners["rerank"], body), atol=1e-6)
            and len(r.json()) == 4
        )
    empty = post(server, "rerank", {"query": "q", "documents": []})
    assert empty.status_code == 400 and "at least one document" in empty.json()["error"]


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_entities_equal_the_pipelines(server, task_models, strategy):
    from transformers import pipeline

    pipe = pipeline("token-classification", model=str(task_models["ner"][0]))
    want = pipe(TEXTS, aggregation_strategy=strategy)
    assert any(want), "the random model found no entity: the comparison would be empty"
    body = {"inputs": TEXTS, "parameters": {"aggregation_strategy": strategy}}
    for path in (f"predictions/{STACK}", f"invocations?model_name={STACK}"):
        r = post(server, "ner", body, path=path)
        assert r.status_code == 200, r.text
        assert same_answers(r.json(), want)


def test_a_text_cut_on_request_keeps_offsets_into_the_text_sent(server, task_models):
    from transformers import pipeline

    pipe = pipeline("token-classification", model=str(task_models["ner"][0]))
    pipe.tokenizer.model_max_length = 32  # the largest bucket: where the server cuts
    assert len(pipe.tokenizer(LONG)["input_ids"]) > 32
    refused = post(server, "ner", {"inputs": LONG})
    assert refused.status_code == 413, refused.text  # not asked to cut: refused, not cut
    r = post(server, "ner", {"inputs": LONG, "parameters": {"truncate": True}})
    assert r.status_code == 200, r.text
    want = pipe(LONG, aggregation_strategy="none")
    assert want and same_answers(r.json(), want)
    assert max(e["end"] for e in r.json()) < LONG.index("Paulo")


def test_answers_equal_the_qa_pipelines_across_windows(server, task_models):
    model_dir = task_models["qa"][0]
    questions = ["Who met Bob?", "Where is the café? 🎉", "x"]
    params = {"top_k": 2, "max_answer_len": 6}
    body = {"inputs": [{"question": q, "context": QA_CONTEXT} for q in questions]}
    r = post(server, "qa", body | {"parameters": params})
    assert r.status_code == 200, r.text
    want = [qa_reference(model_dir, q, QA_CONTEXT, 32, **params) for q in questions]
    assert same_answers(r.json(), want)
    one = {"question": "Who flew home?", "context": QA_CONTEXT}  # ~50 tokens: several windows
    r = post(server, "qa", one, path=f"invocations?model_name={STACK}")
    assert r.status_code == 200, r.text
    assert same_answers(r.json(), qa_reference(model_dir, one["question"], QA_CONTEXT, 32))
    tiny = {"question": "Who?", "context": "東京", "parameters": {"handle_impossible_answer": True}}
    r = post(server, "qa", tiny)
    assert r.status_code == 200, r.text
    assert same_answers(
        r.json(), qa_reference(model_dir, "Who?", "東京", 32, handle_impossible_answer=True)
    )


def test_images_in_every_body_answer_like_the_runner(server, runners):
    one = answer(runners["labels"], IMAGES[0], "image/jpeg")
    raw = post(server, "labels", IMAGES[0], content_type="image/jpeg")
    assert raw.status_code == 200, raw.text
    assert same_answers(raw.json(), one, atol=1e-6)
    headers = {**server.headers(), "X-Neuronserve-Model": "labels"}
    url = f"{server.inference_url}/predictions/{STACK}"
    form = requests.post(
        url, files={"data": ("x.jpg", IMAGES[0], "image/jpeg")}, headers=headers, timeout=60
    )
    assert form.status_code == 200 and same_answers(form.json(), one, atol=1e-6)
    several = requests.post(
        url,
        files=[
            ("a", ("a.png", IMAGES[1], "image/png")),
            ("b", ("b.webp", IMAGES[2], "image/webp")),
        ],
        data={"parameters": '{"top_k": 2}'},
        headers=headers,
        timeout=60,
    )
    assert several.status_code == 200, several.text
    body = {
        "inputs": [base64.b64encode(b).decode() for b in IMAGES[1:3]],
        "parameters": {"top_k": 2},
    }
    assert same_answers(several.json(), answer(runners["labels"], body), atol=1e-6)
    plain = body | {"parameters": {}}
    got = post(server, "features", plain, path=f"invocations?model_name={STACK}")
    assert got.status_code == 200, got.text
    assert same_answers(got.json(), answer(runners["features"], plain), atol=1e-5)


def test_workers_pinned_to_distinct_cores_with_one_thread(server, lease_dir):
    workers = ready_workers(server)
    pids = [int(w["pid"]) for w in workers]
    affinities = []
    for pid in pids:
        threads = worker_affinity(pid)
        cpus = {tuple(c) for c in threads.values()}
        assert len(cpus) == 1, f"threads of {pid} disagree on affinity: {threads}"
        affinities.append(cpus.pop())
    assert len(set(affinities)) == 2 and all(len(a) == 1 for a in affinities)
    records = lease_records(lease_dir)
    for pid, cpus in zip(pids, affinities, strict=True):
        assert records[pid]["cores"] == list(cpus)  # the lease it holds is the core it runs on
        assert records[pid]["threads"] == 1
        assert records[pid]["owner"] == f"torchserve:{STACK}"


def test_concurrent_requests_are_batched_and_answered_correctly(server, runners):
    texts = [f"request number {i}: " + " ".join(["context"] * (i % 7)) for i in range(24)]
    ref = [answer(runners["minilm"], {"inputs": t}) for t in texts]
    barrier = threading.Barrier(len(texts))

    def call(i):
        barrier.wait()
        return post(server, "minilm", {"inputs": texts[i]})

    with ThreadPoolExecutor(len(texts)) as pool:
        results = list(pool.map(call, range(len(texts))))
    for i, r in enumerate(results):
        assert r.status_code == 200
        # batched with others, so padded to another bucket: equal to float32 rounding
        assert np.allclose(r.json(), ref[i], atol=1e-5), texts[i]

    # the handler writes its metrics once the responses have left: a moment later
    def batched_metrics():
        text = requests.get(f"{server.metrics_url}/metrics", timeout=30).text
        sizes = re.findall(
            r'NeuronServeBucketRuns\{[^}]*model="minilm"[^}]*BatchSize="(\d+)"', text
        )
        return text if any(int(n) > 1 for n in sizes) else None

    metrics = wait_for(batched_metrics, 10, 0.1, "a bucket run of several rows in the metrics")
    for name in ("NeuronServePaddingRatio", "NeuronServeBatchTokenizeMs", "NeuronServeModelMs"):
        assert re.search(rf'{name}\{{[^}}]*model="minilm"', metrics), name


def test_bad_requests_fail_alone_inside_a_batch_of_several_models(server, runners):
    """Sent at once, so TorchServe batches them together: requests for four models, good
    and bad; each model's good requests are answered as alone, each bad one fails alone."""
    good = [
        ("minilm", {"inputs": "a fine sentence"}),
        ("minilm", {"inputs": "another fine one"}),
        ("tiny-classifier", {"inputs": "fine"}),
        ("fill", {"inputs": "Bob met [MASK]."}),
        ("ner", {"inputs": TEXTS[0], "parameters": {"aggregation_strategy": "first"}}),
        ("qa", {"question": "Who met Bob?", "context": QA_CONTEXT}),
    ]
    j, deep = "application/json", b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    bad = [
        ("minilm", b'{"inputs": "unterminated', j, 400, "not valid JSON"),
        ("minilm", json.dumps({"inputs": 42}), j, 400, "must be a string"),
        ("minilm", json.dumps({"text": "hi"}), j, 400, 'no "inputs"'),
        ("minilm", json.dumps({"inputs": " ".join(["long"] * 400)}), j, 413, "at most 256"),
        ("minilm", b"\xff\xfe broken", "text/plain", 400, "not valid UTF-8"),
        ("minilm", deep, j, 413, "max_json_depth"),
        ("fill", json.dumps({"inputs": "no mask at all"}), j, 400, "no mask token"),
        ("fill", json.dumps({"inputs": "[MASK]", "parameters": {"top_k": 99}}), j, 400, "top_k"),
        ("ner", json.dumps({"inputs": "x", "parameters": {"aggregation_strategy": "best"}}),
         j, 400, "best"),
        ("qa", json.dumps({"question": "Who?"}), j, 400, "context"),
        ("qa", json.dumps({"question": "Who?", "context": ["a", "list"]}), j, 400, "context"),
    ]  # fmt: skip
    pids_before = sorted(int(w["pid"]) for w in ready_workers(server))
    calls = [(m, json.dumps(b), "application/json") for m, b in good]
    calls += [(m, b, c) for m, b, c, _, _ in bad]
    barrier = threading.Barrier(len(calls))

    def call(args):
        model, body, ctype = args
        barrier.wait()
        return post(server, model, body, content_type=ctype)

    with ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(call, calls))
    for (model, body), r in zip(good, results, strict=False):
        assert r.status_code == 200, (model, r.text)
        assert same_answers(r.json(), answer(runners[model], body), atol=1e-5), model
    for (_, _, _, status, needle), r in zip(bad, results[len(good) :], strict=True):
        assert r.status_code == status, (needle, r.status_code, r.text)
        assert needle in r.json()["error"], r.text
        # the reason phrase is the status's own, the message only in the body
        assert r.reason == HTTPStatus(status).phrase, r.reason
    not_an_image = post(server, "labels", b"<html>not an image</html>", content_type="image/png")
    assert not_an_image.status_code == 400 and "not an image" in not_an_image.json()["error"]
    # nobody crashed: the same two workers are still serving
    assert sorted(int(w["pid"]) for w in ready_workers(server)) == pids_before


def test_killed_worker_is_replaced_on_the_freed_group_with_every_model(server, lease_dir, runners):
    wait_for(lambda: len(ready_workers(server)) == 2, timeout=120, what="two ready workers")
    before = {
        int(w["pid"]): set(next(iter(worker_affinity(int(w["pid"])).values())))
        for w in ready_workers(server)
    }
    victim, survivor = sorted(before)
    os.kill(victim, signal.SIGKILL)

    def replaced():
        ready = ready_workers(server)
        pids = {int(w["pid"]) for w in ready}
        return len(ready) == 2 and victim not in pids and ready

    ready = wait_for(replaced, timeout=180, what="a replacement worker")
    new_pid = next(int(w["pid"]) for w in ready if int(w["pid"]) != survivor)
    assert set(next(iter(worker_affinity(new_pid).values()))) == before[victim]
    assert lease_records(lease_dir)[new_pid]["cores"] == sorted(before[victim])
    line = loaded_by(server, new_pid)
    assert all(f"{m}: buckets" in line for m in MODELS), line
    # with every model: each answers (both workers, a few times over)
    for _ in range(2):
        assert post(server, "minilm", {"inputs": "after the restart"}).status_code == 200
        assert post(server, "qa", {"question": "Who?", "context": QA_CONTEXT}).status_code == 200
        assert post(server, "labels", IMAGES[1], content_type="image/png").status_code == 200


def test_third_worker_fails_with_documented_error(server):
    r = requests.put(
        f"{server.management_url}/models/{STACK}?min_worker=3&max_worker=3",
        headers=server.headers("management"),
        timeout=30,
    )
    assert r.status_code in (200, 202), r.text
    failures = wait_for(
        lambda: worker_failures(server.log_dir),
        timeout=120,
        what="the third worker's failure in the model log",
    )
    msg = failures[0]
    assert "no free cpu core group" in msg and "2 group(s) of 1 core(s)" in msg
    assert "Run at most 2 worker(s)" in msg and "cores_per_worker" in msg
    # who holds each group: this server's workers, named by their model
    assert "held by pid" in msg and f"(torchserve:{STACK})" in msg.split("[", 1)[1]
    assert len(ready_workers(server)) == 2
    assert post(server, "minilm", {"inputs": "still serving"}).status_code == 200
    # Last test of the module on purpose: scaling back down while the failed worker
    # waits in TorchServe 0.12's retry backoff lets that retry start an untracked
    # worker process, which would then hold the next group a restart frees.
