"""tritonserver's process control where it meets the OS, with stand-in processes: a child
reaped the moment it dies, a crashed server's stubs stopped before the next start, a
start that stalls saying where it waits, a healer that stops waiting for a removal
Triton never finishes. The rest of Triton's units, which start nothing, are
tests/unit/test_triton_units.py."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from helpers import wait_for

from neuronserve.engines.triton import process as triton


def test_a_removal_triton_never_finishes_is_reported_not_waited_on(tmp_path, monkeypatch):
    """Triton's Python backend waits forever for a stub killed while it sent a response,
    and taking that instance out never returns: the healer stops waiting after REMOVE_S,
    says why and what to do, and sends no later update (it would wait behind the first)."""
    import http.server
    import threading

    from neuronserve.engines.triton import healer as h

    groups = [{"name": f"cores{i}", "count": 1, "host_policy": f"cores{i}"} for i in range(2)]
    loads: list[str] = []
    release = threading.Event()

    class Triton(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # the model's config
            body = json.dumps({"name": "m", "instance_group": groups}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # a load that never finishes
            self.rfile.read(int(self.headers["Content-Length"]))
            loads.append(self.path)
            release.wait(30)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Triton)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(h, "REMOVE_S", 0.5)
    healer = object.__new__(h.Healer)
    healer.run_dir, healer.server_pid = tmp_path, os.getpid()
    healer.url, healer.headers = f"http://127.0.0.1:{server.server_address[1]}", {}
    healer.groups = {"m": groups}
    healer.states = {"m": h.ModelState(alive=1, expected=2)}
    healer.generation, healer.wedged = {}, set()
    try:
        healer.heal("m", ["cores1_0"])
    finally:
        release.set()
        server.shutdown()
    state = json.loads((tmp_path / h.STATUS_FILE).read_text())["m"]
    assert state["state"] == "wedged" and "did not take cores1_0 out" in state["last_error"]
    assert "Restarting the server makes the model whole" in state["last_error"]
    assert loads == ["/v2/repository/models/m/load"]  # the removal only
    assert healer.wedged == {"m"}
    # what the front reads to restart the server: the wedged model alone, with why
    healer.states["n"] = h.ModelState(alive=1, expected=2, state="failed", last_error="retry")
    healer.write_status()
    inst = triton.TritonInstance(tmp_path, "http://x", "x", "http://x")
    assert list(inst.wedged()) == ["m"] and "did not take" in inst.wedged()["m"]
    (tmp_path / h.STATUS_FILE).unlink()
    assert inst.wedged() == {}


@pytest.fixture
def crashed_server(tmp_path):
    """A "server" that led its own session, as tritonserver runs, killed, its "stub"
    child left running in its process group; a stub of another server beside it.
    Yields (run dir naming the dead server, its pid, the orphan, the bystander)."""
    import os
    import signal
    import subprocess

    import psutil

    from neuronserve.engines.triton.stubs import STUB

    stub = tmp_path / STUB
    stub.symlink_to("/bin/sleep")
    server = subprocess.Popen(
        ["/bin/bash", "-c", f"{stub} 300 & exec /bin/sleep 300"], start_new_session=True
    )
    bystander = subprocess.Popen([str(stub), "300"])
    try:
        wait_for(lambda: psutil.Process(server.pid).children(), timeout=10, what="the stub")
        orphan = psutil.Process(server.pid).children()[0]
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        assert orphan.is_running()  # orphaned, still holding what it held
        run_dir = tmp_path / "run"
        run_dir.mkdir(mode=0o700)
        (run_dir / triton.PID_FILE).write_text(f"{server.pid}\n")
        yield run_dir, server.pid, orphan, bystander
    finally:
        bystander.kill()
        server.kill()


def gone(process) -> bool:
    import psutil

    return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE


def test_a_reaped_child_that_dies_is_gone_not_a_zombie():
    """A child left to `reap` leaves no zombie when it dies, while its parent lives on
    (a zombie passes kill(pid, 0), the check by which Triton's stubs watch their
    server); a child nobody reaps stays one."""
    import os
    import signal
    import subprocess

    import psutil

    from neuronserve.processes import reap

    def zombie(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    reaped, left = subprocess.Popen(["sleep", "300"]), subprocess.Popen(["sleep", "300"])
    try:
        reap(reaped)
        for p in (reaped, left):
            os.kill(p.pid, signal.SIGKILL)
        wait_for(lambda: zombie(left.pid), timeout=10, what="the unreaped child's death")
        # Popen.wait collects the child (its pid is gone) a moment before it records the
        # status, so wait for the status and then ask for the pid.
        wait_for(lambda: reaped.returncode is not None, timeout=10, what="the reaping")
        assert reaped.returncode == -signal.SIGKILL
        assert not psutil.pid_exists(reaped.pid)
        os.kill(left.pid, 0)  # the zombie passes the stubs' check: no error
    finally:
        left.wait()


def test_a_crashed_servers_stubs_are_stopped_before_the_next_start(crashed_server):
    """The next start (or stop) from a dead server's run directory kills the stubs it
    left holding their core leases, and only them."""
    run_dir, _, orphan, bystander = crashed_server
    said: list[str] = []
    assert triton.stop(run_dir, log=said.append) is False
    assert gone(orphan)
    assert bystander.poll() is None, "a stub of another server was stopped"
    assert "stopped 1 stub process(es) it left" in said[0]
    assert not (run_dir / triton.PID_FILE).exists()


def test_a_server_killed_before_its_healer_watches_it_leaves_no_stub(crashed_server):
    """Killed while its healer starts: the healer, handed the server's pid, still kills
    the stubs it left, and only them; a healer called wrongly says how to call it."""
    from neuronserve.engines.triton.healer import main

    run_dir, server_pid, orphan, bystander = crashed_server
    assert main([str(run_dir)]) == 2
    assert main([str(run_dir), str(server_pid)]) == 0
    assert gone(orphan)
    assert bystander.poll() is None, "a stub of another server was stopped"


STUB_SCRIPT = """
import faulthandler, signal, threading
faulthandler.register(signal.SIGUSR1, all_threads=True)
print("stub up", flush=True)
def waiting_forever():
    threading.Event().wait()
waiting_forever()
"""


def test_a_start_that_stalls_after_every_instance_is_ready_says_where_it_waits(
    tmp_path, monkeypatch
):
    """tritonserver whose instances all logged ready but which never answers: the wait
    gives up after STALL_S (not the whole timeout) with StartStalled, having kept where
    the server's threads wait and had each stub print its Python stacks into the log."""
    import subprocess

    import psutil

    from neuronserve.engines.triton.stubs import STUB
    from neuronserve.processes import free_ports, record_pid

    monkeypatch.setattr(triton, "STALL_S", 0.5)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (tmp_path / STUB).symlink_to(sys.executable)
    (tmp_path / "stub.py").write_text(STUB_SCRIPT)
    log = run_dir / triton.LOG_FILE
    with log.open("w") as out:
        # a "server" whose two "stubs" serve model m (a stub's first argument is model.py)
        server = subprocess.Popen(
            [
                "/bin/bash",
                "-c",
                f"for i in 1 2; do {tmp_path / STUB} {tmp_path}/stub.py & done; wait",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        record_pid(run_dir / triton.PID_FILE, server.pid)
        wait_for(lambda: log.read_text().count("stub up") == 2, timeout=30, what="the stubs")
        stubs = psutil.Process(server.pid).children()
        port = free_ports(1)[0]  # nothing listens there
        inst = triton.TritonInstance(run_dir, f"http://127.0.0.1:{port}", "", "", {"m": 2})
        ready = 'model.py:100] "neuronserve: cores{}_0 pid {} leased ...; ready after 1.00s"\n'
        with log.open("a") as out:
            out.write(ready.format(0, stubs[0].pid))
        with pytest.raises(triton.ServeError, match="not READY"):
            # one instance of two said it is ready: a slow load, not a stall
            triton.wait_ready(inst, ["m"], timeout_s=2, log=lambda *_: None, poll_s=0.1)
        with log.open("a") as out:
            out.write(ready.format(1, stubs[1].pid))
        t0 = time.monotonic()
        with pytest.raises(triton.StartStalled, match="did not answer"):
            triton.wait_ready(inst, ["m"], timeout_s=60, log=lambda *_: None, poll_s=0.1)
        assert time.monotonic() - t0 < 30
        report = (run_dir / triton.STALL_REPORT).read_text()
        assert f"pid {server.pid} bash" in report and all(f"pid {p.pid}" in report for p in stubs)
        wait_for(lambda: log.read_text().count("waiting_forever") >= 2, 10, what="the stacks")
    finally:
        subprocess.run(["pkill", "-KILL", "-g", str(server.pid)], check=False)
        server.wait()
