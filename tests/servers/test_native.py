"""neuronserve's workers as only they behave, started for real behind `serve front` (the
front's contract is test_front_contract.py): each worker holds its own cores and a socket
only its user may open, which another local user cannot connect to; a worker killed
under load is replaced alone while the front sends its requests once more to the other;
a frozen worker is taken for hung and replaced; a malformed frame closes its own
connection and nothing else; a second deployment on the same cores is refused naming
this one, leaving nothing running."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import struct
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
from helpers import (
    NO_NOBODY,
    as_nobody,
    free_port,
    reference_embeddings,
    run_cli,
    wait_for,
    write_spec,
)

from neuronserve.serve.deployment import running_workers
from neuronserve.serve.front.launch import WORKERS_DIR

pytestmark = pytest.mark.server


class NativeFront:
    def __init__(self, work: Path, port: int, started: str):
        self.work, self.url, self.started = work, f"http://127.0.0.1:{port}", started

    def embed(self, text: str, timeout: float = 60) -> requests.Response:
        return requests.post(f"{self.url}/embed", json={"inputs": text}, timeout=timeout)

    def engine(self):
        return running_workers(self.work / "front" / WORKERS_DIR)

    def states(self) -> list[dict]:
        return self.engine().states()

    def health(self) -> dict:
        return requests.get(f"{self.url}/health", timeout=10).json()


@pytest.fixture(scope="module")
def front(tmp_path_factory, tiny_artifact):
    work = tmp_path_factory.mktemp("native")
    port = free_port()
    write_spec(
        work,
        front_port=port,
        front_run_dir="front",
        workers=2,
        cores_per_worker=1,
        # short, for the frozen worker's test; long enough that a batch slowed by the whole
        # suite's load is not taken for hung
        response_timeout_s=10,
    )
    out = run_cli("serve", "front", tiny_artifact, "--spec", "deploy.yaml", cwd=work)
    front = NativeFront(work, port, out.stdout)
    yield front
    run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=work)
    assert front.engine() is None, "the engine outlived the front"
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(work) in " ".join(p.info["cmdline"] or [])
    ], "a process of the deployment outlived its stop"


def _ready(front: NativeFront) -> bool:
    states = front.states()
    return len(states) == 2 and all(w["state"] == "ready" for w in states)


def test_each_worker_holds_its_own_core_and_a_socket_of_its_users(front):
    assert "tiny (feature-extraction" in front.started and "on 2 worker(s)" in front.started
    states = front.states()
    cores = [frozenset(psutil.Process(w["pid"]).cpu_affinity()) for w in states]
    assert len(cores) == 2 and len(set(cores)) == 2 and all(len(c) == 1 for c in cores)
    sockets = front.engine().run_dir / "sockets"
    assert stat.S_IMODE(sockets.stat().st_mode) == 0o700
    for path in sockets.iterdir():
        st = path.lstat()
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_uid == os.getuid()


# run as `nobody`: connect to each socket given, say what happened to each
_CONNECT = r"""
import socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        print("connected")
    except OSError as e:
        print(type(e).__name__)
"""


@pytest.mark.skipif(as_nobody() is None, reason=NO_NOBODY)
def test_another_local_user_cannot_reach_a_worker(front):
    """A worker answers whoever connects (the front's keys and limits are checked before
    it): another local user must not be able to connect at all."""
    paths = sorted(str(p) for p in (front.engine().run_dir / "sockets").iterdir())
    assert len(paths) == 2
    said = subprocess.run(
        [*as_nobody(), "-c", _CONNECT, *paths],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    assert said == ["PermissionError", "PermissionError"], said
    assert front.embed("still served").status_code == 200


def test_answers_equal_the_model_computed_another_way(front, tiny_embedder_dir):
    texts = ["one short text", "and another one, a little longer than the first"]
    r = requests.post(f"{front.url}/embed", json={"inputs": texts}, timeout=60)
    assert r.status_code == 200
    want = reference_embeddings(tiny_embedder_dir, texts)
    assert np.allclose(np.array(r.json()), want, atol=1e-4)


def test_a_large_request_on_an_idle_server_runs_on_every_worker(front, tiny_embedder_dir):
    """One request of eight texts at a time: each is spread over both idle workers (each
    worker's CPU read from its process), and its answers are the model's in order."""
    texts = [f"text number {i} " + "and some more words to read " * (4 + 2 * i) for i in range(8)]
    want = reference_embeddings(tiny_embedder_dir, texts)
    workers = [psutil.Process(w["pid"]) for w in front.states()]
    before = [sum(p.cpu_times()[:2]) for p in workers]
    for _ in range(40):
        r = requests.post(f"{front.url}/embed", json={"inputs": texts}, timeout=60)
        assert r.status_code == 200
        assert np.allclose(np.array(r.json()), want, atol=1e-4)
    used = [sum(p.cpu_times()[:2]) - b for p, b in zip(workers, before, strict=True)]
    # on one worker, the other would have used next to nothing
    assert min(used) > 0.3 * max(used), used


def test_a_worker_killed_under_load_is_replaced_alone_and_no_request_fails(front):
    wait_for(lambda: _ready(front), 60, what="both workers ready")
    before = {w["index"]: w["pid"] for w in front.states()}
    statuses: list[int] = []
    stop = threading.Event()

    def client():
        while not stop.is_set():
            statuses.append(front.embed("under load").status_code)

    clients = [threading.Thread(target=client) for _ in range(4)]
    for c in clients:
        c.start()
    try:
        wait_for(lambda: len(statuses) > 20, 30, what="load")
        os.kill(before[0], signal.SIGKILL)
        wait_for(lambda: front.health()["workers_ready"] == 1, 10, 0.05, "the front to see it")
        assert front.health()["status"] == "degraded"
        # the supervisor's own word: a new process at index 0, ready
        # one read of the states for both: read twice, the supervisor could mark the dead
        # one between them (ready, then a pid of None)
        replaced = wait_for(
            lambda: (s := {w["index"]: w for w in front.states()}) and len(s) == 2
            and all(w["state"] == "ready" for w in s.values()) and s[0]["pid"] != before[0] and s,
            60, what="a replacement",
        )  # fmt: skip
        n = len(statuses)
        wait_for(lambda: len(statuses) > n + 20, 30, what="load on the replacement")
    finally:
        stop.set()
        for c in clients:
            c.join()
    # every request answered: a dead worker's requests went once more to the other
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    after = replaced  # as they were once the replacement was ready
    assert after[1]["pid"] == before[1] and after[1]["restarts"] == 0, after  # served on
    assert after[0]["pid"] != before[0] and after[0]["restarts"] == 1, after
    replacement = psutil.Process(after[0]["pid"])
    assert replacement.cpu_affinity() != psutil.Process(before[1]).cpu_affinity()
    assert front.health()["status"] == "ok"
    previous = front.engine().run_dir / "worker0.log.previous"
    assert "serving on" in previous.read_text()  # the dead one's log is kept


def test_a_frozen_worker_is_taken_for_hung_and_replaced(front):
    wait_for(lambda: _ready(front), 60, what="both workers ready")
    frozen = {w["index"]: w["pid"] for w in front.states()}[1]
    os.kill(frozen, signal.SIGSTOP)
    try:
        # the other serves meanwhile (a request sent to the frozen one goes once more to
        # the other when the frozen one is killed)
        assert front.embed("while one is frozen", timeout=30).status_code == 200
        wait_for(lambda: not psutil.pid_exists(frozen), 30, 0.1, "the frozen worker killed")
    finally:
        if psutil.pid_exists(frozen):
            os.kill(frozen, signal.SIGCONT)
    wait_for(lambda: _ready(front), 60, what="its replacement ready")
    log = (front.engine().run_dir / "supervisor.log").read_text()
    assert front.embed("after").status_code == 200
    states = {w["index"]: w for w in front.states()}
    assert states[1]["pid"] != frozen and states[1]["restarts"] == 1
    assert "Traceback" not in log


def test_a_malformed_frame_fails_alone_and_nothing_else(front):
    """A whole frame whose head does not parse is answered with its own id (400); junk
    that ends inside a frame closes its connection with no answer; the workers serve on."""
    wait_for(lambda: _ready(front), 60, what="both workers ready")
    before = {w["index"]: w["pid"] for w in front.states()}
    path = front.engine().run_dir / "sockets" / "worker0.sock"
    for junk, answered in (
        (struct.pack("<IIq", 1 << 31, 4, 3) + b"junk", False),  # over the bound, cut short
        (struct.pack("<IIq", 5, 5, 4) + b"nope!", True),  # a head that is not JSON
        (b"GET / HTTP/1.1\r\n\r\n", False),  # not our wire at all
    ):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(path))
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            got = b""
            while chunk := s.recv(1 << 16):
                got += chunk
        if not answered:
            assert got == b""  # closed, with no answer
            continue
        _, head_size, rid = struct.unpack("<IIq", got[:16])
        head = json.loads(got[16 : 16 + head_size])
        assert (rid, head["id"], head["status"]) == (4, 4, 400), head
    answers = [front.embed(f"served after junk {i}").status_code for i in range(8)]
    assert answers == [200] * 8
    time.sleep(1.5)  # a supervisor ping after the junk: the worker is still the same one
    assert {w["index"]: w["pid"] for w in front.states()} == before


def test_a_second_deployment_on_the_same_cores_is_refused_naming_this_one(front, tiny_artifact):
    wait_for(lambda: _ready(front), 60, what="both workers ready")
    other = front.work / "other"
    other.mkdir()
    port = free_port()
    write_spec(other, front_port=port, front_run_dir="run", workers=1)
    proc = run_cli(
        "serve", "front", tiny_artifact, "--spec", "deploy.yaml", "--timeout", "120",
        cwd=other, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    engine_run = front.work / "front" / WORKERS_DIR / "run"
    said = proc.stdout + proc.stderr
    assert "worker 0 could not start" in said
    assert f"of another deployment (run directory {engine_run})" in said
    assert running_workers(other / "run" / WORKERS_DIR) is None
    assert front.embed("still served").status_code == 200
