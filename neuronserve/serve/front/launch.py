"""`neuronserve serve front` in the background: start the front (server.py) as its own
process, show its progress, return once /health answers 200; `--stop` stops it, and
with it the workers, and waits until all are gone.

Everything lives in the run directory (0700): the settings the process was started
with, its pid file and log, and a generated API key when one was needed.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...processes import (
    Background,
    ServeError,
    listeners,
    port_taken,
    private_dir,
    private_file,
    terminate,
)
from ...spec import DeploySpec
from ...waiting import until
from ...workers import process
from ..deployment import RUN_DIR
from .config import FrontConfig

# the workers' folder in the run folder
WORKERS_DIR = "workers"
SETTINGS_FILE = "front.json"
PID_FILE = "front.pid"
LOG_FILE = "front.log"


@dataclass(frozen=True)
class FrontInstance:
    config: FrontConfig
    pid: int
    log: Path
    # how many worker processes serve behind it
    workers: int


def _front(run_dir: Path) -> Background:
    return Background("front", Path(run_dir).resolve() / PID_FILE, "neuronserve serve front --stop")


def refuse_second(run_dir: Path) -> None:
    """ServeError when a front of `run_dir` runs already."""
    _front(run_dir).refuse_second(Path(run_dir).resolve())


def start(
    spec: DeploySpec,
    sources: list[Path],
    timeout_s: float = 600,
    log: Callable[[str], None] = print,
) -> FrontInstance:
    """Start the front and the workers behind it on the models in `sources` (or the
    spec's, when empty); return once every worker is ready."""
    # this user's own folder, before anything is read from or written to it
    run_dir = private_dir(Path(spec.front.run_dir).resolve())
    # a generated key is written here, before the start
    config = FrontConfig.of(spec.front, spec.limits, spec.multi_model)
    front = _front(run_dir)
    front.refuse_second(run_dir)
    taken = port_taken(config.address, config.port)
    if taken:
        raise ServeError(f"the front cannot listen: {taken}")
    settings = run_dir / SETTINGS_FILE
    with private_file(settings) as f:
        f.write(
            json.dumps(
                {
                    "spec": spec.model_dump(mode="json", exclude_unset=True),
                    "sources": [str(Path(x).resolve()) for x in sources],
                }
            )
        )
    log_path = run_dir / LOG_FILE
    proc = front.spawn(
        [sys.executable, "-m", "neuronserve.serve.front.server", str(settings)], log_path
    )
    front.record(proc.pid)
    try:
        _wait_healthy(config, proc, log_path, timeout_s, log)
    except BaseException:
        stop(run_dir, log=lambda _: None)
        raise
    running = process.running(run_dir / WORKERS_DIR / RUN_DIR)
    return FrontInstance(config, proc.pid, log_path, running.workers if running else 0)


def _wait_healthy(
    config: FrontConfig,
    proc: subprocess.Popen,
    log_path: Path,
    timeout_s: float,
    log: Callable[[str], None],
) -> None:
    """Poll /health, echoing the front's log as it grows (the workers' progress)."""
    shown = 0
    # the front's own certificate may be self-signed: this check only asks our process
    context = ssl._create_unverified_context() if config.tls_cert else None

    def healthy() -> bool:
        nonlocal shown
        lines = log_path.read_text(errors="replace").splitlines()
        for line in lines[shown:]:
            log(f"  {line}")
        shown = len(lines)
        if proc.poll() is not None:
            # the caller may have silenced the echo, and may delete the run directory
            end = "\n  ".join(log_path.read_text(errors="replace").splitlines()[-12:])
            raise ServeError(
                f"the front exited during start (status {proc.returncode}); "
                f"the end of {log_path}:\n  {end}"
            )
        try:
            with urllib.request.urlopen(f"{config.url}/health", timeout=5, context=context) as r:
                return r.status == 200 and _listening(proc.pid, config.port)
        except (urllib.error.URLError, OSError):
            return False

    if not until(healthy, timeout_s, 0.5):
        raise ServeError(f"the front was not ready after {timeout_s:.0f}s; see {log_path}")


def _listening(pid: int, port: int) -> bool:
    """Whether process `pid` is the one listening on `port` (the answer came from it, not
    from a server that took the port first); True when that cannot be told (its exit is
    caught above)."""
    found = listeners(port)
    return found is None or pid in found


def stop(run_dir: Path, timeout_s: float = 180, log: Callable[[str], None] = print) -> bool:
    """SIGTERM the front (it drains, then stops its workers) and wait until it is gone;
    then stop its workers if they still run: a front killed at the deadline, or one that
    died, did not."""
    run_dir = Path(run_dir).resolve()
    stopped = _front(run_dir).stop(terminate, timeout_s, log) is not None
    workers = run_dir / WORKERS_DIR / RUN_DIR
    if process.running(workers) is not None:
        log("the front left its workers running")
        stopped = process.stop(workers, log=log) or stopped
    if not stopped:
        log(f"no front is running from {run_dir}")
        return False
    log("front stopped")
    return True
