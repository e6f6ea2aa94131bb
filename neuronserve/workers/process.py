"""The workers' process control, from the front's side: start the supervisor on a
deployment of the store (it starts the workers), return once every worker answers on its
socket; say how the workers are; stop them all."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cores import DEPLOYMENT_ENV
from ..pids import alive
from ..processes import Background, ServeError, private_dir, private_file, reap, terminate
from ..waiting import until
from .store import models_in, read_deployment
from .supervisor import SOCKETS, STATUS_FILE, SUPERVISOR_FILE, log_path

PID_FILE = "supervisor.pid"
LOG_FILE = "supervisor.log"


@dataclass
class RunningWorkers:
    """The running supervisor and workers: their run folder (sockets, logs, states)."""

    run_dir: Path
    workers: int

    @property
    def pid(self) -> int | None:
        return _supervisor(self.run_dir).running()

    @property
    def log(self) -> Path:
        return self.run_dir / LOG_FILE

    def states(self) -> list[dict[str, Any]]:
        """Each worker's state as the supervisor last wrote it ([] before it did)."""
        return states(self.run_dir)


def states(run_dir: Path) -> list[dict[str, Any]]:
    try:
        found = json.loads((Path(run_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return []
    workers = found.get("workers") if isinstance(found, dict) else None
    return workers if isinstance(workers, list) else []


def ready(found: list[dict[str, Any]]) -> int:
    """How many of the workers `states` gave are ready and still alive (the supervisor
    writes a death down within LOOK_S; a reader must not count the dead meanwhile)."""
    return sum(1 for w in found if w.get("state") == "ready" and alive(w.get("pid")))


def _supervisor(run_dir: Path) -> Background:
    return Background(
        "workers' supervisor", Path(run_dir) / PID_FILE, "neuronserve serve front --stop"
    )


def deployment_dir(store: Path) -> Path:
    """The one deployment a store holds."""
    found = models_in(store)
    if not found:
        raise ServeError(f"{store} holds no model")
    if len(found) > 1:
        raise ServeError(
            f"{store} holds several deployments ({', '.join(found)}): package one per store"
        )
    return Path(store).resolve() / found[0]


def start(
    store: Path, run_dir: Path, timeout_s: float, log: Callable[[str], object]
) -> RunningWorkers:
    """Start the supervisor and its workers on the store's deployment; return once every
    worker answers (stopping them again if that fails)."""
    model_dir = deployment_dir(store)
    run_dir = private_dir(Path(run_dir).resolve())
    server = _supervisor(run_dir)
    server.refuse_second(run_dir)
    private_dir(run_dir / SOCKETS)
    (run_dir / STATUS_FILE).unlink(missing_ok=True)
    _, workers, _ = read_deployment(model_dir)
    with private_file(run_dir / SUPERVISOR_FILE) as f:
        json.dump({"model_dir": str(model_dir), "workers": workers}, f)
    log(f"starting {workers} worker(s) (run folder {run_dir}) ...")
    proc = server.spawn(
        [sys.executable, "-m", "neuronserve.workers.supervisor", str(run_dir)],
        run_dir / LOG_FILE,
        env=_env(run_dir),
    )
    server.record(proc.pid)
    reap(proc)
    instance = RunningWorkers(run_dir, workers)
    try:
        _wait_ready(instance, timeout_s, log)
    except BaseException:
        stop(run_dir, log=lambda *_: None)
        raise
    return instance


def _env(run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    # workers record which deployment they serve in their core leases, so a worker that
    # finds every core taken can say whose workers hold them; until a worker has pinned
    # itself, nothing should spread threads across every core
    env.update(
        {
            DEPLOYMENT_ENV: str(run_dir),
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


def _wait_ready(instance: RunningWorkers, timeout_s: float, log: Callable[[str], object]) -> None:
    """Until every worker is ready; a worker that could not start (it said why) or the
    supervisor gone fail the start at once, with what they said."""
    said = ""

    def all_ready() -> bool:
        nonlocal said
        found = instance.states()
        if instance.pid is None:
            tail = (
                instance.log.read_text(errors="replace")[-2000:] if instance.log.is_file() else ""
            )
            raise ServeError(f"the workers' supervisor exited during start:\n{tail}")
        failed = [w for w in found if w.get("state") == "dead" and w.get("why")]
        if failed:
            w = failed[0]
            raise ServeError(
                f"worker {w['index']} could not start ({w['why']}); its log: "
                f"{log_path(instance.run_dir, int(w['index']))}"
            )
        count = ready(found)
        summary = f"  {count} of {instance.workers} worker(s) ready"
        if summary != said:
            log(summary)
            said = summary
        return bool(found) and count == instance.workers

    if not until(all_ready, timeout_s):
        raise ServeError(f"the workers were not ready after {timeout_s:.0f}s")


def running(run_dir: Path) -> RunningWorkers | None:
    run_dir = Path(run_dir).resolve()
    if _supervisor(run_dir).running() is None:
        return None
    try:
        config = json.loads((run_dir / SUPERVISOR_FILE).read_text())
    except (OSError, ValueError):
        return None
    return RunningWorkers(run_dir, int(config["workers"]))


def stop(run_dir: Path, timeout_s: float = 60, log: Callable[[str], object] = print) -> bool:
    """Stop the supervisor (it stops its workers and waits for them)."""
    run_dir = Path(run_dir).resolve()
    others = _supervisor(run_dir).stop(terminate, timeout_s, log)
    if others is None:
        log(f"no workers are running from {run_dir}")
        return False
    log(f"the workers stopped ({others} process(es))")
    return True
