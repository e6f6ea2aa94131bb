"""Servers `neuronserve bench` starts itself: each one only while it is measured, so
two servers never compete for the same cores, on free ports and with its own run
directories. The front runs as `neuronserve serve front` starts it, and the SageMaker
entrypoint as the container runs it, each in its own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import requests

from .. import placement
from ..artifact import read_manifest
from ..cores import LEASE_DIR_ENV
from ..processes import free_ports, stop_tree
from ..serve.deployment import RUN_DIR
from ..spec import WorkerSection, env_of, load_spec
from ..waiting import until
from ..workers import process


def bench_worker(layout: str, worker: WorkerSection | None = None) -> WorkerSection:
    """The workers of a server bench starts: their batching as `worker` (the bench
    command's) says, `layout`, and room for slow points."""
    given = worker.model_dump(exclude_unset=True) if worker is not None else {}
    return WorkerSection.model_validate({**given, "layout": layout, "response_timeout_s": 300})


def _supervisor_pid(work: Path) -> int | None:
    running = process.running(work / RUN_DIR)
    return running.pid if running is not None else None


def keep_logs(tmp: Path, into: Path, most_bytes: int = 1 << 20) -> list[Path]:
    """The log files under a started server's temporary folder `tmp` (its workers' and its
    front's `*.log`), the last `most_bytes` of each, copied into `into` under the same
    paths: what a bench session that measured errors leaves for a look afterwards."""
    kept = []
    for log in sorted(Path(tmp).rglob("*.log")):
        if not log.is_file():
            continue
        dest = into / log.relative_to(tmp)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - most_bytes))
            dest.write_bytes(f.read())
        kept.append(dest)
    return kept


def layout_plan(artifact: Path, worker: WorkerSection) -> placement.WorkerPlan:
    """The worker plan `neuronserve package` makes for `worker` on this host."""
    return placement.plan(placement.PlanRequest.of(worker, [read_manifest(artifact, verify=False)]))


class _Started:
    """A server bench starts: its workers as `neuronserve package` plans them on this host,
    a temporary folder of its own (its leases in it), on a free port."""

    url: str
    metrics_url: str
    workers_work: Path

    def __init__(self, artifact: Path, layout: str, worker: WorkerSection | None, kind: str):
        self.artifact, self.layout = Path(artifact), layout
        self.worker = bench_worker(layout, worker)
        plan = layout_plan(self.artifact, self.worker)
        self.workers, self.cores_per_worker = plan.workers, plan.cores_per_worker
        self.tmp = tempfile.TemporaryDirectory(prefix=f"ns-bench-{kind}-")
        self.lease_dir = Path(self.tmp.name) / "leases"
        self.port = free_ports(1)[0]
        self.front_pid: int | None = None

    def root_pids(self) -> list[int]:
        pids = [self.front_pid, _supervisor_pid(self.workers_work)]
        return [p for p in pids if p is not None]


class FrontServer(_Started):
    """neuronserve's front and its workers, started as `neuronserve serve front` starts
    them, so one session measures each of its routes on the same running processes."""

    def __init__(self, artifact: Path, layout: str, worker: WorkerSection | None = None):
        from ..serve.front.launch import WORKERS_DIR

        super().__init__(artifact, layout, worker, "front")
        self.name = read_manifest(self.artifact, verify=False).name
        self.run_dir = Path(self.tmp.name) / "front"
        self.workers_work = self.run_dir / WORKERS_DIR
        front = {
            "port": self.port,
            "run_dir": self.run_dir,
            # the load generator decides the load: no limit of the front's may refuse it
            "max_in_flight": 100_000,
            "deadline_s": 600,
        }
        worker_fields = self.worker.model_dump(exclude_unset=True)
        self.spec = load_spec(None, {"worker": worker_fields, "front": front})
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"{self.url}/metrics"
        # the lease variable as it was before start (its workers inherit this process's
        # environment), put back at stop
        self._leases_before: str | None = None

    def start(self) -> None:
        from ..serve.front import launch

        self._leases_before = os.environ.get(LEASE_DIR_ENV)
        os.environ[LEASE_DIR_ENV] = str(self.lease_dir)
        self.front_pid = launch.start(self.spec, [self.artifact], log=lambda _: None).pid

    def stop(self, cleanup: bool = True) -> None:
        from ..serve.front import launch

        if self.front_pid is not None:
            launch.stop(self.run_dir, log=lambda _: None)
            self.front_pid = None
            if self._leases_before is None:
                os.environ.pop(LEASE_DIR_ENV, None)
            else:
                os.environ[LEASE_DIR_ENV] = self._leases_before
        if cleanup:
            self.tmp.cleanup()


class SageMakerServer(_Started):
    """The SageMaker container entrypoint (`python -m
    neuronserve.platforms.sagemaker.entrypoint`), serving /ping and /invocations on a
    free port."""

    def __init__(self, artifact: Path, layout: str):
        super().__init__(artifact, layout, None, "sagemaker")
        self.workers_work = Path(self.tmp.name)
        self.url = f"http://127.0.0.1:{self.port}/invocations"
        self.metrics_url = f"http://127.0.0.1:{self.port}/metrics"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 600) -> None:
        work = Path(self.tmp.name)
        env = {
            **os.environ,
            "NEURONSERVE_PLATFORM": "sagemaker",
            "NEURONSERVE_MODEL_DIR": str(self.artifact.resolve()),
            env_of("front", "address"): "127.0.0.1",
            env_of("front", "port"): str(self.port),
            "NEURONSERVE_WORK_DIR": str(work),
            env_of("worker", "workers"): str(self.workers),
            env_of("worker", "cores_per_worker"): str(self.cores_per_worker),
            LEASE_DIR_ENV: str(self.lease_dir),
        }
        self.log = open(work / "sagemaker.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = proc = subprocess.Popen(
            [sys.executable, "-m", "neuronserve.platforms.sagemaker.entrypoint"],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.front_pid = proc.pid

        def pinged() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the SageMaker entrypoint exited: "
                    f"{(work / 'sagemaker.log').read_text()[-2000:]}"
                )
            try:
                return requests.get(f"http://127.0.0.1:{self.port}/ping", timeout=2).ok
            except requests.RequestException:
                return False

        if not until(pinged, timeout_s, 0.5):
            raise RuntimeError(f"the SageMaker entrypoint was not ready after {timeout_s:.0f}s")

    def stop(self, cleanup: bool = True) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            stop_tree(proc.pid, lambda: proc.send_signal(signal.SIGTERM), 120)
            proc.wait()
        self.proc = self.front_pid = None
        if getattr(self, "log", None):
            self.log.close()
        if cleanup:
            self.tmp.cleanup()


def cpu_by_role(roots: list[int], front: int | None = None) -> dict[str, float]:
    """CPU seconds (user + system) so far of the process trees under `roots`, by role:
    neuronserve's front (the process `front`) and the workers (their supervisor's
    included)."""
    from ..host_load import tree_cpu

    out: dict[str, float] = {}
    for p, seconds in tree_cpu(roots):
        role = "front" if p.pid == front else "workers"
        out[role] = out.get(role, 0.0) + seconds
    return out


MODEL_MS_SERIES = "neuronserve_model_ms_total"


def model_ms(metrics_url: str) -> float | None:
    """The time the workers behind a server have spent in the model so far (ms, every
    model and worker), read from its /metrics; None where it cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        got = requests.get(metrics_url, timeout=10)
        got.raise_for_status()
        families = list(text_string_to_metric_families(got.text))
    except (requests.RequestException, ValueError):
        return None
    return sum(s.value for f in families for s in f.samples if s.name == MODEL_MS_SERIES)
