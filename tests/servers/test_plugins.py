"""Triton and TorchServe as the plugins their own servers run: what `neuronserve package
triton` and `neuronserve package torchserve` write, served by tritonserver and TorchServe
started as their users start them (tests/plugin_servers.py), with no neuronserve
process between. Answers equal the eager model, single and batched; every worker
process (Triton's stubs, TorchServe's workers) is pinned to a core group of its own,
read from /proc; a malformed request fails alone while its neighbours are served; what
a SIGKILLed worker leads to (TorchServe replaces it; Triton's Python backend does not,
as the Triton guide says); a clean stop; a TorchServe store served from where it was
moved."""

from __future__ import annotations

import os
import shutil
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
from helpers import (
    LABELS,
    eager_classifier_scores,
    label_scores,
    ports_for,
    reference_embeddings,
    run_cli,
    wait_for,
)
from plugin_servers import (
    affinity,
    start_torchserve,
    start_tritonserver,
    stop_torchserve,
    stop_tritonserver,
)

pytestmark = pytest.mark.server
TEXTS = ["hello world", "a text about the quarterly revenue of a company", "x", "ok"]


@pytest.fixture(scope="module")
def two_cores():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPU cores for two worker processes of a core each")


def _package_triton(work, *artifacts) -> object:
    repo = work / "repo"
    run_cli(
        "package", "triton", *artifacts, "--repository", repo, "--instances", "2",
        "--cores-per-instance", "1",
    )  # fmt: skip
    return repo


@pytest.fixture(scope="module")
def triton(tmp_path_factory, two_cores, tiny_artifact, classifier_artifact):
    work = tmp_path_factory.mktemp("triton-as-users-run-it")
    server = start_tritonserver(_package_triton(work, tiny_artifact, classifier_artifact), work)
    yield server
    if server.process is not None and server.process.poll() is None:  # a test failed first
        stop_tritonserver(server)


def _triton_infer(server, model: str, texts: list[str], datatype: str = "BYTES"):
    body = {
        "inputs": [{"name": "TEXT", "shape": [len(texts), 1], "datatype": datatype, "data": texts}],
        "parameters": {"model": model},
    }
    return requests.post(f"{server.url}/v2/models/models/infer", json=body, timeout=60)


def _output(answer, name: str) -> np.ndarray:
    [out] = [o for o in answer.json()["outputs"] if o["name"] == name]
    return np.asarray(out["data"], dtype=np.float64).reshape(out["shape"])


def test_triton_answers_as_the_eager_model_single_and_batched(
    triton, tiny_embedder_dir, classifier_dir
):
    want = reference_embeddings(tiny_embedder_dir, TEXTS)
    one = _triton_infer(triton, "tiny", TEXTS[:1])
    assert one.status_code == 200, one.text
    np.testing.assert_allclose(_output(one, "EMBEDDING"), want[:1], atol=1e-5)
    batched = _triton_infer(triton, "tiny", TEXTS)
    np.testing.assert_allclose(_output(batched, "EMBEDDING"), want, atol=1e-5)
    scores = _output(_triton_infer(triton, "tiny-classifier", TEXTS), "SCORES")
    np.testing.assert_allclose(scores, eager_classifier_scores(classifier_dir, TEXTS), atol=1e-5)


def test_each_triton_stub_holds_a_core_group_of_its_own(triton):
    stubs = triton.running("triton_python_backend_stub")
    assert len(stubs) == 2
    groups = [affinity(p.pid) for p in stubs]
    assert len(set(groups)) == 2 and all(g.isdigit() for g in groups), groups


def test_a_malformed_triton_request_fails_alone(triton, tiny_embedder_dir):
    want = reference_embeddings(tiny_embedder_dir, TEXTS[:1])

    def good():
        return _triton_infer(triton, "tiny", TEXTS[:1])

    def bad(i):
        if i % 2:
            return _triton_infer(triton, "tiny", [1, 2], datatype="INT32")  # not texts
        return _triton_infer(triton, "nope", TEXTS[:1])  # a model it does not hold

    with ThreadPoolExecutor(8) as pool:
        goods = [pool.submit(good) for _ in range(12)]
        bads = [pool.submit(bad, i) for i in range(6)]
        answered = [f.result() for f in goods]
        refused = [f.result() for f in bads]
    assert all(400 <= r.status_code < 500 for r in refused), [r.text for r in refused]
    assert "nope" in refused[0].json()["error"]
    for r in answered:
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(_output(r, "EMBEDDING"), want, atol=1e-5)


def test_tritonserver_stops_cleanly_on_sigterm(triton):
    """As a container runtime stops it: exit status 0, and no stub left holding a core."""
    assert stop_tritonserver(triton) == 0, triton.log.read_text()[-2000:]


def test_a_killed_triton_stub_is_not_replaced_as_the_guide_says(tmp_path, two_cores, tiny_artifact):
    """Triton's Python backend keeps a model whose stub was SIGKILLed ready and hands the
    dead instance its share of requests (500); the other instance serves. What to set is
    in the Triton guide."""
    envs = set(Path("/tmp").glob("python_env_*"))  # what Triton's stubs make in /tmp
    server = start_tritonserver(_package_triton(tmp_path, tiny_artifact), tmp_path)
    started = server.children()
    try:
        stubs = server.running("triton_python_backend_stub")
        stubs[0].send_signal(signal.SIGKILL)
        wait_for(lambda: not stubs[0].is_running() or stubs[0].status() == "zombie", 10)
        body = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                            "data": ["hello"]}]}  # fmt: skip
        statuses = [
            requests.post(f"{server.url}/v2/models/tiny/infer", json=body, timeout=30).status_code
            for _ in range(8)
        ]
        assert 200 in statuses and 500 in statuses, statuses
        assert requests.get(f"{server.url}/v2/health/ready", timeout=5).status_code == 200
    finally:
        server.process.kill()  # type: ignore[union-attr]
        server.process.wait(30)  # type: ignore[union-attr]
        for p in started:
            if p.is_running():
                p.kill()
        for left in set(Path("/tmp").glob("python_env_*")) - envs:  # a killed stub's
            shutil.rmtree(left, ignore_errors=True)


def _package_torchserve(store, *artifacts, served_from=None) -> dict[str, int]:
    ports = ports_for(
        "inference-port", "management-port", "metrics-port", "grpc-inference-port",
        "grpc-management-port",
    )  # fmt: skip
    run_cli(
        "package", "torchserve", *artifacts, "--model-store", store, "--workers", "2",
        "--cores-per-worker", "1", *(f"--{k}={v}" for k, v in ports.items()),
        *(["--served-from", served_from] if served_from else []),
    )  # fmt: skip
    return ports


@pytest.fixture(scope="module")
def torchserve(tmp_path_factory, two_cores, tiny_artifact, classifier_artifact):
    work = tmp_path_factory.mktemp("torchserve-as-users-run-it")
    written = work / "written"
    # served from elsewhere, as KServe mounts a store: packaged saying where
    store = work / "mounted" / "model-store"
    _package_torchserve(written, tiny_artifact, classifier_artifact, served_from=store)
    store.parent.mkdir()
    shutil.move(str(written), store)
    server = start_torchserve(store, work / "run")
    yield server, work / "run"
    stop_torchserve(server, work / "run")


def _predict(server, model: str | None, body, **headers):
    named = {"X-Neuronserve-Model": model} if model else {}
    return requests.post(
        f"{server.url}/predictions/models",
        json=body,
        headers={**server.headers, **named, **headers},
        timeout=60,
    )


def _workers(server) -> list:
    return server.running("model_service_worker")


def test_torchserve_answers_as_the_eager_model_from_a_moved_store(
    torchserve, tiny_embedder_dir, classifier_dir
):
    server, _ = torchserve
    want = reference_embeddings(tiny_embedder_dir, TEXTS)
    one = _predict(server, "tiny", {"inputs": TEXTS[0]})
    assert one.status_code == 200, one.text
    np.testing.assert_allclose(np.asarray(one.json()), want[0], atol=1e-5)
    batched = _predict(server, "tiny", {"inputs": TEXTS})
    np.testing.assert_allclose(np.asarray(batched.json()), want, atol=1e-5)
    scores = _predict(server, "tiny-classifier", {"inputs": TEXTS, "parameters": {"top_k": None}})
    got = np.asarray([label_scores(r) for r in scores.json()])
    np.testing.assert_allclose(got, eager_classifier_scores(classifier_dir, TEXTS), atol=1e-5)
    assert len(LABELS) == got.shape[1]


def test_each_torchserve_worker_holds_a_core_group_of_its_own(torchserve):
    server, _ = torchserve
    groups = [affinity(p.pid) for p in _workers(server)]
    assert len(groups) == 2 and len(set(groups)) == 2, groups


def test_a_malformed_torchserve_request_fails_alone(torchserve, tiny_embedder_dir):
    server, _ = torchserve
    want = reference_embeddings(tiny_embedder_dir, TEXTS[:1])

    def bad(i):
        if i % 2:
            return _predict(server, "tiny", {"inputs": [1, 2, 3]})  # not texts
        return _predict(server, "nope", {"inputs": "x"})  # a model it does not hold

    with ThreadPoolExecutor(8) as pool:
        goods = [pool.submit(_predict, server, "tiny", {"inputs": TEXTS[0]}) for _ in range(12)]
        bads = [pool.submit(bad, i) for i in range(6)]
        answered, refused = [f.result() for f in goods], [f.result() for f in bads]
    assert all(400 <= r.status_code < 500 for r in refused), [r.text for r in refused]
    for r in answered:
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.asarray(r.json()), want[0], atol=1e-5)


def test_a_killed_torchserve_worker_is_replaced_on_its_core_group(torchserve, tiny_embedder_dir):
    """Last in the module: TorchServe starts a new worker, which leases the group the dead
    one held (the OS freed it), and answers."""
    server, _ = torchserve
    workers = _workers(server)
    before = {p.pid: affinity(p.pid) for p in workers}
    victim = workers[0]
    victim.send_signal(signal.SIGKILL)

    def replaced() -> bool:  # and pinned: a new worker leases and pins as it starts
        now = _workers(server)
        if len(now) != 2 or victim.pid in {p.pid for p in now}:
            return False
        try:
            return all(affinity(p.pid).isdigit() for p in now)
        except OSError:
            return False

    wait_for(replaced, 180, what="TorchServe's replacement worker")
    want = reference_embeddings(tiny_embedder_dir, TEXTS[:1])

    def answers() -> bool:
        r = _predict(server, "tiny", {"inputs": TEXTS[0]})
        return r.status_code == 200 and np.allclose(r.json(), want[0], atol=1e-5)

    wait_for(lambda: all(answers() for _ in range(4)), 180, what="answers again")

    def both_ready() -> bool:  # as TorchServe's management API says
        got = requests.get(
            f"{server.management}/models/models", headers=server.manage_headers, timeout=5
        ).json()
        ready = [w for w in got[0].get("workers", []) if w.get("status") == "READY"]
        return len(ready) == 2 and len(_workers(server)) == 2

    # read once both are READY: a replacement TorchServe restarted again (its own
    # backoff) is unpinned until it has started
    wait_for(both_ready, 180, what="both workers READY")
    after = {p.pid: affinity(p.pid) for p in _workers(server)}
    logs = "".join(f.read_text(errors="replace")[-3000:] for f in server.log.parent.glob("*.log"))
    assert sorted(after.values()) == sorted(before.values()), (before, after, logs)
