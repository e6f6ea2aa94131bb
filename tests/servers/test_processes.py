"""What needs processes (or a listening socket) of its own, short of a model server: a
fresh interpreter's imports (no torch before a worker pins its cores, none in the
front), the built wheel, a pid file that names another process, a lease whose holder
died, starts refused before they made anything, doctor reading a front's pace over HTTP.
What starts nothing is in tests/unit."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pytest
from helpers import ports_for

from neuronserve.host_load import front_pace


def _open_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    path.chmod(0o777)
    return path


def test_modules_import_alone_and_workers_start_before_torch():
    # a cycle shows up as an ImportError when the module in the middle is imported first
    # (compile/driver -> runtime -> compile was one)
    for module in ("neuronserve.compile.driver", "neuronserve.runtime"):
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True, timeout=120)
    # the adapters lease and pin through these before anything may import torch
    code = (
        "import sys, neuronserve.worker, neuronserve.metrics; "
        "assert 'torch' not in sys.modules, 'torch imported before the pin'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_front_imports_no_torch():
    code = (
        "import sys, neuronserve.serve.front.app, neuronserve.serve.front.server; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


@pytest.fixture
def bystander():
    """An unrelated process whose pid a stale pid file happens to name."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_stop_leaves_a_process_a_stale_pid_file_names_alone(tmp_path, bystander):
    from neuronserve.processes import live_pid, record_pid
    from neuronserve.serve.front import launch

    run = tmp_path / "front"
    run.mkdir()
    pid_file = run / launch.PID_FILE
    # a file from before a reboot: the number only
    pid_file.write_text(f"{bystander.pid}\n")
    assert launch.stop(run, log=lambda _: None) is False
    # recorded for a process that started at another time (the number was reused)
    record_pid(pid_file, bystander.pid)
    identity = pid_file.with_name(pid_file.name + ".identity")
    data = json.loads(identity.read_text())
    assert live_pid(pid_file) == bystander.pid  # the real record is trusted
    identity.write_text(json.dumps({**data, "started": "ticks:1"}))
    assert live_pid(pid_file) is None
    assert launch.stop(run, log=lambda _: None) is False
    identity.write_text(json.dumps({**data, "cmdline": ["java", "torchserve"]}))
    assert launch.stop(run, log=lambda _: None) is False
    assert bystander.poll() is None  # still running


def _start(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """A start that must refuse at once; on code that does not, it would serve until
    killed, which the timeout turns into a failure."""
    try:
        return subprocess.run(
            argv, env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv} started in a folder other users can write")


def test_serve_front_in_the_foreground_refuses_an_open_run_folder(tmp_path, tiny_artifact):
    """The reproduction: a 0777 run folder, multi-model, the admin key from the
    environment (so no key file is generated, the only place the check used to run)."""
    run = _open_folder(tmp_path / "run")
    port = ports_for("port")["port"]
    done = _start(
        [sys.executable, "-m", "neuronserve.cli", "serve", "front", "--foreground",
         "--multi-model", "--run-dir", str(run), "--port", str(port), str(tiny_artifact)],
        {"NEURONSERVE_ADMIN_KEY": "k" * 32},
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"run directory {run} is writable by other users" in done.stdout + done.stderr
    assert list(run.iterdir()) == []  # nothing written into it


def test_the_sagemaker_entrypoint_refuses_an_open_work_folder(tmp_path):
    work = _open_folder(tmp_path / "work")
    done = _start(
        [sys.executable, "-m", "neuronserve.platforms.sagemaker.entrypoint"],
        {
            "NEURONSERVE_WORK_DIR": str(work),
            "NEURONSERVE_PLATFORM": "sagemaker",
            "SAGEMAKER_MULTI_MODEL": "true",
            "SAGEMAKER_BIND_TO_PORT": str(ports_for("port")["port"]),
        },
        tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{work} is writable by other users" in done.stdout + done.stderr
    assert list(work.iterdir()) == []


def test_doctor_reads_a_fronts_pace_from_two_scrapes(monkeypatch):
    from neuronserve import host_load

    server = http.server.HTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Metrics.scrapes = [_scrape(100, 5.0, 1.0), _scrape(10100, 6.0, 19.0)]
    clock = iter([0.0, 10.0])
    monkeypatch.setattr(host_load.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(host_load.time, "sleep", lambda s: None)
    monkeypatch.setattr(host_load.os, "cpu_count", lambda: 4)
    try:
        first, verdict = front_pace(f"http://127.0.0.1:{server.server_port}", 10.0)
    finally:
        server.shutdown()
    # 10,000 requests in 10 s; 1 CPU second of 40 (0.1 ms each); 18 of 20 core-seconds busy
    assert "1000.0 requests/s" in first and "0.10 ms per request" in first
    assert "2% of this host's 4 CPUs" in first and "NeuronCores 90% busy (2 in use)" in first
    assert verdict.startswith("pace set by the chip")


class _Metrics(http.server.BaseHTTPRequestHandler):
    """Serves two scrapes of a front: before, then after 10 s of load."""

    scrapes: ClassVar[list[str]] = []

    def do_GET(self):
        body = self.scrapes.pop(0).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _scrape(requests: float, cpu: float, busy: float) -> str:
    return (
        f'neuronserve_front_requests_total{{route="/embed",status="200",model="m"}} {requests}\n'
        f'neuronserve_host_cpu_seconds_total{{role="front"}} {cpu / 2}\n'
        f'neuronserve_host_cpu_seconds_total{{role="engine"}} {cpu / 2}\n'
        "neuronserve_neuroncores_in_use 2\n"
        f'neuronserve_neuroncore_busy_seconds_total{{neuroncore="0"}} {busy / 2}\n'
        f'neuronserve_neuroncore_busy_seconds_total{{neuroncore="1"}} {busy / 2}\n'
    )
