"""What another local user sees of a running deployment, tried as they would: `nobody`
(through runuser) reads every process's command line in /proc and opens whatever
appears in /dev/shm while tritonserver starts and serves. And the mechanisms those
rest on, on any host: the admin key handed to tritonserver outside its command line,
the /dev/shm of its own, and doctor, which never carries a key across a redirect.

Each test fails on the code before the fourth security review: the key was readable
while the wrapper started tritonserver, and without CAP_SYS_ADMIN tritonserver used the
host's /dev/shm, whose request regions are 0644 until their stub starts."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from helpers import NO_NOBODY, as_nobody, package_for, ports_for, run_cli

from neuronserve.engines.triton import launch
from neuronserve.engines.triton.process import ADMIN_HEADER, ADMIN_KEY_FILE, PID_FILE

pytestmark = pytest.mark.server

ANOTHER_USER = pytest.mark.skipif(as_nobody() is None, reason=NO_NOBODY)

# Run as `nobody` until its stdin closes: what it could read of tritonserver's options
# from /proc/*/cmdline (every restricted-API option it saw), how often it saw
# tritonserver at all, and how many sweeps it made.
_READ_COMMAND_LINES = r"""
import json, os, sys, threading
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
seen, triton, sweeps = set(), 0, 0
while not done.is_set():
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        if b"tritonserver" in raw:
            triton += 1
        seen.update(
        a.decode(errors="replace")
        for a in raw.split(b"\0")
        if a.startswith(b"--") and b"restricted" in a
    )
    sweeps += 1
print(json.dumps({"seen": sorted(seen), "triton": triton, "sweeps": sweeps}))
"""

# Run as `nobody` until its stdin closes: every Triton region that appears in /dev/shm,
# and those it could open (what it would then read requests from).
_OPEN_REGIONS = r"""
import json, os, sys, threading, time
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
seen, opened, held = set(), set(), []
while not done.is_set():
    for name in os.listdir("/dev/shm"):
        if "triton_python_backend" not in name:
            continue
        seen.add(name)
        if name in opened:
            continue
        try:
            held.append(os.open(f"/dev/shm/{name}", os.O_RDONLY))
            opened.add(name)
        except OSError:
            pass
    time.sleep(0.001)
print(json.dumps({"seen": sorted(seen), "opened": sorted(opened)}))
"""


class AsNobody:
    """A script run as `nobody` beside the test; `result()` ends it and reads its report."""

    def __init__(self, script: str):
        self.proc = subprocess.Popen(
            [*as_nobody(), "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
        )

    def result(self) -> dict:
        out, err = self.proc.communicate("", timeout=60)
        assert self.proc.returncode == 0, err
        return json.loads(out)


@pytest.fixture
def repository(tmp_path, tiny_artifact, monkeypatch) -> Path:
    """A one-instance Triton repository of the tiny embedder, with leases of its own."""
    from neuronserve.spec import load_spec

    spec = load_spec(None, {"artifact": tiny_artifact, "worker": {"workers": 1},
                            "triton": {"repository": tmp_path / "repo"}})  # fmt: skip
    package_for("triton", spec)
    monkeypatch.setenv("NEURONSERVE_LEASE_DIR", str(tmp_path / "leases"))
    return tmp_path / "repo"


def _infer(http_url: str, headers: dict[str, str]) -> int:
    body = {
        "inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a secret"]}]
    }
    r = requests.post(f"{http_url}/v2/models/tiny/infer", json=body, headers=headers, timeout=60)
    return r.status_code


@ANOTHER_USER
def test_no_local_user_reads_a_working_admin_key_at_start_or_restart(tmp_path, repository):
    """`nobody` sweeping /proc/*/cmdline while tritonserver starts, stops and starts
    again with a new key (what the front's restart does): whatever it reads of the
    restricted-API options opens nothing."""
    from neuronserve.engines.triton.process import Listen, start, stop

    ports = ports_for("http", "grpc", "metrics")
    listen = Listen(ports["http"], ports["grpc"], ports["metrics"], inference_key=True)
    run_dir = tmp_path / "run"
    poller = AsNobody(_READ_COMMAND_LINES)
    keys = []
    try:
        for _ in range(2):
            inst = start(repository, run_dir, listen, timeout_s=300, log=lambda *_: None)
            keys.append((run_dir / ADMIN_KEY_FILE).read_text().strip())
            assert _infer(inst.http_url, inst.headers()) == 200  # the key works for us
            stop(run_dir, log=lambda *_: None)
        inst = start(repository, run_dir, listen, timeout_s=300, log=lambda *_: None)
        report = poller.result()
        assert keys[0] != keys[1]
        assert report["triton"] > 0 and report["sweeps"] > 50, report  # it did look
        assert report["seen"] == [
            "--grpc-restricted-protocol=hidden",
            "--http-restricted-api=hidden",
        ], report
        # and what it read, tried as the attack does: nothing opens the repository API
        for option in report["seen"]:
            value = option.split("=", 1)[1]
            header, _, key = value.partition(":")[2].partition("=")
            r = requests.post(
                f"{inst.http_url}/v2/repository/index",
                headers={header or ADMIN_HEADER: key or value},
                json={},
                timeout=10,
            )
            assert r.status_code != 200, option
    finally:
        if poller.proc.poll() is None:
            poller.result()
        stop(run_dir, log=lambda *_: None)


@ANOTHER_USER
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv drops the capability")
def test_without_cap_sys_admin_no_local_user_opens_a_request_region(tmp_path, repository):
    """tritonserver started by a root that lacks CAP_SYS_ADMIN (a container's root, say)
    still gets a /dev/shm of its own (a user namespace): `nobody`, watching the host's
    /dev/shm every millisecond from before the start, sees no region to open."""
    ports = ports_for("http", "grpc", "metrics")
    run_dir = tmp_path / "run"
    poller = AsNobody(_OPEN_REGIONS)
    neuronserve = Path(sys.executable).with_name("neuronserve")
    try:
        started = subprocess.run(
            ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin",
             str(neuronserve), "serve", "triton", "--repository", str(repository),
             "--run-dir", str(run_dir), "--http-port", str(ports["http"]),
             "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"])],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        pid = int((run_dir / PID_FILE).read_text())
        for _ in range(3):
            assert _infer(f"http://127.0.0.1:{ports['http']}", {}) == 200
        report = poller.result()
        assert report["opened"] == [], report
        assert report["seen"] == [], report  # the host's /dev/shm never held one
        # without the capability, the namespace it has is a user namespace's
        assert launch.private(pid)
        assert os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user")
    finally:
        if poller.proc.poll() is None:
            poller.result()
        run_cli("serve", "triton", "--stop", "--run-dir", run_dir, check=False)


# the program the mechanism tests run: its arguments and its /dev/shm, as it sees them
_SHOW = "import json, os, sys; print(json.dumps([sys.argv[1:], oct(os.stat('/dev/shm').st_mode)]))"


def _traced(shown: list[str], env: dict[str, str], hand_over: bool) -> tuple[list, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", launch.__name__, "--traced", *shown],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        text=True,
    )
    if hand_over:
        launch.hand_over(proc, shown)
        seen = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
    else:  # a tracer that lets it go without handing anything over
        os.waitpid(proc.pid, 0)
        seen = ""
        launch._libc().ptrace(launch.PTRACE_DETACH, proc.pid, None, None)
    out, _ = proc.communicate(timeout=60)
    return json.loads(out), seen


def test_a_hidden_option_reaches_the_program_and_never_its_command_line():
    secret = "s3cr3t-" + os.urandom(8).hex()
    cmd = [sys.executable, "-c", _SHOW, f"--http-restricted-api=a,b:h={secret}", "--x=1"]
    shown, env = launch.hide(cmd, secret)
    (args, shm), seen = _traced(shown, env, hand_over=True)
    assert args == [f"--http-restricted-api=a,b:h={secret}", "--x=1"]
    assert secret not in seen and "--http-restricted-api=hidden" in seen
    # in a /dev/shm of its own (a mount namespace with CAP_SYS_ADMIN, else a user one)
    assert shm == "0o40700"
    # not handed over (the tracer died, say): the program reads the placeholder, which
    # tritonserver refuses to start with
    (args, _), _ = _traced(shown, env, hand_over=False)
    assert args == ["--http-restricted-api=hidden", "--x=1"]


def test_what_the_program_writes_in_its_dev_shm_never_reaches_the_hosts():
    name = f"neuronserve-test-{os.getpid()}"
    done = subprocess.run(
        [sys.executable, "-m", launch.__name__, "/bin/sh", "-c",
         f"stat -c %a /dev/shm && touch /dev/shm/{name} && ls /dev/shm"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["700", name]
    assert not (Path("/dev/shm") / name).exists()


def test_doctor_never_follows_a_redirect_with_the_key():
    """A front address that redirects elsewhere: doctor says so and sends the key to no
    one but the address it was given."""
    from neuronserve.host_load import front_pace

    heard: list[str | None] = []
    ports = ports_for("redirect", "elsewhere")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            heard.append(self.headers.get("Authorization"))
            if self.server.server_port == ports["redirect"]:
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{ports['elsewhere']}/metrics")
                self.end_headers()
            else:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"neuronserve_front_requests_total 1\n")

        def log_message(self, *args):
            pass

    servers = [http.server.HTTPServer(("127.0.0.1", p), Handler) for p in ports.values()]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        with pytest.raises(OSError, match=r"a redirect to .*not followed"):
            front_pace(f"http://127.0.0.1:{ports['redirect']}", 0, "the-key")
        deadline = time.monotonic() + 5
        while not heard and time.monotonic() < deadline:
            time.sleep(0.01)
        assert heard == ["Bearer the-key"]  # the redirecting address only
    finally:
        for s in servers:
            s.shutdown()
