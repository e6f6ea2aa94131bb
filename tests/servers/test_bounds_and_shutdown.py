"""The SageMaker entrypoint (the front and its workers) under bounds and shutdown: a
burst beyond the workers' queues (spec max_queued, set through NEURONSERVE_MAX_QUEUED)
is refused at once with 503 while the accepted requests are answered right; a client's
X-Request-Timeout is honoured (504 naming it) and a bad one is a 400; SIGTERM under load
lets every request in flight finish with the right answer, refuses new ones, stops the
workers and leaves no process and no held lease behind."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest
import requests
from helpers import SENTENCES, wait_for

from neuronserve.bench.servers import SageMakerServer
from neuronserve.bench.soak import held_leases

pytestmark = pytest.mark.server
QUEUED = 4
TEXTS = [SENTENCES[8]] * 8


@pytest.fixture(scope="module")
def server(minilm_artifact):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPU cores for two workers")
    os.environ["NEURONSERVE_MAX_QUEUED"] = str(QUEUED)
    try:
        server = SageMakerServer(minilm_artifact, "throughput")
        server.start()
    finally:
        os.environ.pop("NEURONSERVE_MAX_QUEUED")
    yield server
    server.stop()


def in_flight(metrics_url: str) -> float:
    text = requests.get(metrics_url, timeout=5).text
    line = next(ln for ln in text.splitlines() if ln.startswith("neuronserve_front_in_flight "))
    return float(line.split()[1])


def refused(url: str) -> bool:
    try:
        requests.post(url, json={"inputs": "late"}, timeout=5)
    except requests.ConnectionError:
        return True
    return False


def want_rows(runner, texts):
    body = json.dumps({"inputs": texts}).encode()
    return np.array(runner.responses_for_bodies([(body, "application/json")])[0])


def test_a_burst_beyond_the_workers_queues_is_refused_at_once(server, minilm_runner):
    url = server.url
    want = want_rows(minilm_runner, TEXTS)
    barrier = threading.Barrier(32)

    def one(_):
        barrier.wait()
        t0 = time.monotonic()
        r = requests.post(url, json={"inputs": TEXTS}, timeout=120)
        return r, time.monotonic() - t0

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(one, range(32)))
    refused = [(r, s) for r, s in answers if r.status_code == 503]
    served = [(r, s) for r, s in answers if r.status_code == 200]
    assert refused and served and len(refused) + len(served) == 32, [
        r.status_code for r, _ in answers
    ]
    assert all(np.allclose(r.json(), want, atol=1e-4) for r, _ in served)
    # refused without waiting for a worker: sooner than the slowest accepted request
    assert min(s for _, s in refused) < max(s for _, s in served)


def test_the_clients_deadline_is_honoured(server):
    front = server.url.removesuffix("/invocations")
    bad = requests.post(server.url, json={"inputs": "x"}, headers={"X-Request-Timeout": "soon"})
    assert bad.status_code == 400 and "X-Request-Timeout" in bad.text
    supervisor = server.root_pids()[1]
    workers = psutil.Process(supervisor).children(recursive=True)
    for p in workers:
        os.kill(p.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        late = requests.post(
            server.url, json={"inputs": "frozen"}, headers={"X-Request-Timeout": "1.5"}, timeout=60
        )
        waited = time.monotonic() - t0
    finally:
        for p in workers:
            os.kill(p.pid, signal.SIGCONT)
    assert late.status_code == 504 and "X-Request-Timeout" in late.text, late.text
    assert waited < 10  # the client's 1.5 s, not the server's 30 s
    wait_for(lambda: requests.get(f"{front}/ping", timeout=5).status_code == 200, 60)


def test_sigterm_under_load_finishes_what_was_accepted(server, minilm_runner):
    # as many texts as one worker call carries (the model's largest batch), each long
    # enough for its longest shape: each request one call that keeps a worker busy
    texts = [" ".join(SENTENCES)[:900]] * 8
    want = want_rows(minilm_runner, texts)
    proc, lease_dir = server.proc, server.lease_dir
    tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    # as many as the workers are sure to admit: requests arriving together may all be
    # queued before any worker takes one; the front sends each request as one call
    n = QUEUED
    barrier = threading.Barrier(n + 1)

    def one(_):
        barrier.wait()
        return requests.post(server.url, json={"inputs": texts}, timeout=120)

    metrics = server.url.removesuffix("/invocations") + "/metrics"
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        barrier.wait()
        # SIGTERM once the front holds all of them (its in-flight gauge says so)
        wait_for(lambda: in_flight(metrics) == n, 30, 0.02, f"{n} requests in flight")
        proc.send_signal(signal.SIGTERM)
        answers = [f.result() for f in futures]
    assert [r.status_code for r in answers] == [200] * n
    assert all(np.allclose(r.json(), want, atol=1e-4) for r in answers)
    # the listening socket closes once the front starts stopping
    wait_for(lambda: refused(server.url), 30, 0.1, "new connections refused")
    assert proc.wait(timeout=120) == 0
    alive = [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive, alive
    assert held_leases(lease_dir) == []
