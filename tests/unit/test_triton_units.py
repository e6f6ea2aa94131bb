"""triton_backend/model.py's pure parts, imported with Triton's real utils module, and
the numpy guard of `serve triton`."""

import importlib.util
import json
import os
import sys
import time

import pytest
from helpers import REPO, wait_for

from neuronserve.engines.triton import process as triton
from neuronserve.processes import ServeError


@pytest.fixture(scope="module")
def model_py():
    utils_dir = triton._pytriton_root() / "backends" / "python"
    sys.path.insert(0, str(utils_dir))
    try:
        spec = importlib.util.spec_from_file_location(
            "ns_triton_model", REPO / "triton_backend" / "model.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(utils_dir))


def test_instance_index_counts_across_groups(model_py):
    config = {"instance_group": [{"count": 2}, {"count": 3}]}
    assert model_py.instance_index("minilm_0_0", config) == 0
    assert model_py.instance_index("minilm_0_1", config) == 1
    assert model_py.instance_index("minilm_1_0", config) == 2
    assert model_py.instance_index("my_model_x_1_2", config) == 4  # underscores in the name
    # the groups neuronserve writes, one per core group: the group's own, whatever the
    # config holds now (the healer reloads with a dead instance's group left out)
    ours = {"instance_group": [{"name": "cores0", "count": 1}, {"name": "cores3", "count": 1}]}
    assert model_py.instance_index("cores3_0", ours) == 3
    assert model_py.instance_index("cores12_0", ours) == 12


def test_errors_keep_the_runners_status_as_far_as_triton_can_say_it(model_py):
    from neuronserve.tasks import RequestError

    # the HTTP status Triton answers each code with (servers/test_triton.py sees them)
    http = {"INVALID_ARG": 400, "INTERNAL": 500, "UNAVAILABLE": 503, "NOT_FOUND": 404}
    cases = [
        (400, "INVALID_ARG", "bad field"),
        (500, "INTERNAL", "model execution failed"),
        (503, "UNAVAILABLE", "busy"),
        (413, "INVALID_ARG", "[413] too long"),
    ]
    for status, code, message in cases:
        sent = RequestError(message.removeprefix("[413] "), status)
        assert model_py.error_code(sent) == (code, message)
        # what neuronserve's front reads back from the engine's answer
        back = RequestError.from_engine(message, http[code])
        assert (back.status, back.message) == (status, sent.message)


def test_numpy_2_is_refused(monkeypatch):
    import numpy

    monkeypatch.setattr(numpy, "__version__", "2.1.0")
    with pytest.raises(ServeError, match="numpy<2"):
        triton.check_numpy()


def test_backend_directory_links_this_pythons_stub(tmp_path):
    root = triton._pytriton_root()
    backends = triton.backend_directory(root, tmp_path)
    stub = backends / "python" / "triton_python_backend_stub"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert (
        stub.resolve()
        == (root / "python_backend_stubs" / version / "triton_python_backend_stub").resolve()
    )
    assert (backends / "python" / "libtriton_python.so").resolve().is_file()


def test_serve_without_models_is_a_clear_error(tmp_path):
    with pytest.raises(ServeError, match="package triton"):
        triton.start(tmp_path, tmp_path / "run")


def test_glibc_older_than_2_35_is_refused_for_triton():
    import re

    from neuronserve.engines.triton.section import glibc_refusal

    assert re.search(r"glibc 2.35 or newer.*Ubuntu 22.04", glibc_refusal("glibc 2.31") or "")
    assert glibc_refusal("glibc 2.35") is None
    assert glibc_refusal() is None  # this machine


def test_the_healer_replaces_one_instance_only_where_each_group_is_one_core_group():
    from neuronserve.engines.triton.healer import instance_names, partitioned

    ours = [
        {"name": "cores0", "count": 1, "host_policy": "cores0"},
        {"name": "cores1", "count": 1, "host_policy": "cores1.2"},  # replaced twice
    ]
    assert partitioned(ours) and instance_names(ours) == ["cores0_0", "cores1_0"]
    # Triton tells instances apart by their group's settings, not its name: groups that
    # differ only in name, or a group of several, are reloaded whole
    same_policy = [{**g, "host_policy": "cpu"} for g in ours]
    several = [{"name": "m_0", "count": 2, "host_policy": ""}]
    assert not partitioned(same_policy) and not partitioned(several)
    assert instance_names(several) == ["m_0_0", "m_0_1"]


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
        wait_for(lambda: not psutil.pid_exists(reaped.pid), timeout=10, what="the reaping")
        assert reaped.returncode == -signal.SIGKILL
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
    import sys

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


def test_a_stalled_start_is_tried_once_more_with_its_log_kept(tmp_path, monkeypatch):
    repo, run_dir = tmp_path / "repo", tmp_path / "run"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    tries: list[list[str]] = []

    def launch(cmd, inst, timeout_s, log):
        tries.append(cmd)
        inst.log.write_text(f"try {len(tries)}\n")
        if len(tries) == 1:
            raise triton.StartStalled("stalled")
        return inst

    monkeypatch.setattr(triton, "_launch", launch)
    said: list[str] = []
    inst = triton.start(repo, run_dir, log=said.append)
    assert len(tries) == 2 and tries[0] == tries[1] and inst.expected == {"m": 1}
    assert (run_dir / triton.STALLED_LOG).read_text() == "try 1\n"
    assert inst.log.read_text() == "try 2\n"
    assert any("stalled" in s and "once more" in s for s in said)

    def stalls(cmd, inst, timeout_s, log):
        tries.append(cmd)
        raise triton.StartStalled("stalled again")

    monkeypatch.setattr(triton, "_launch", stalls)
    with pytest.raises(triton.StartStalled, match="stalled again"):
        triton.start(repo, tmp_path / "run2", log=said.append)
    assert len(tries) == 4  # once more, not again and again


def test_ports_handed_to_servers_are_below_the_ephemeral_range():
    """A port from the range the kernel takes outgoing connections' source ports from can
    be taken before the server given it binds it (tritonserver's metrics port was):
    free_ports picks distinct ports below that range, each free to bind."""
    import socket

    from neuronserve.processes import EPHEMERAL_RANGE, free_ports

    ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = free_ports(8)
    assert len(set(ports)) == 8 and all(p < ephemeral for p in ports), (ports, ephemeral)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
