"""Servers `neuronserve bench` starts itself: each one only while it is measured, so
two servers never compete for the same cores, on free ports and with its own run
directories. TorchServe and Triton are packaged and started by serve/engine.py, as the
SageMaker entrypoint does it; the SageMaker front runs as the container entrypoint
would, in its own process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from .. import placement
from ..artifact import read_manifest
from ..serve.engine import Engine
from ..serve.process import free_ports, stop_tree
from ..spec import load_spec


class ManagedServer:
    """TorchServe or Triton serving one artifact in the given layout."""

    def __init__(
        self,
        engine: str,
        artifact: Path,
        layout: str,
        max_batch_delay_ms: int | None,
        batch_requests: int | None = None,
    ):
        self.tmp = tempfile.TemporaryDirectory(prefix=f"ns-bench-{engine}-")
        settings = {
            "layout": layout,
            "max_batch_delay_ms": max_batch_delay_ms,
            "batch_requests": batch_requests,
            "response_timeout_s": 300,
        }
        self.engine = Engine(
            engine,
            Path(artifact),
            Path(self.tmp.name),
            {k: v for k, v in settings.items() if v is not None},
        )
        self.layout, self.name = layout, self.engine.name
        self.workers = self.engine.plan.workers
        self.cores_per_worker = self.engine.plan.cores_per_worker
        self._lease_dir: str | None = None
        self.started = False

    def start(self) -> None:
        # workers inherit this process's environment: their own lease directory, put
        # back in stop()
        self._lease_dir = os.environ.get("NEURONSERVE_LEASE_DIR")
        os.environ["NEURONSERVE_LEASE_DIR"] = str(Path(self.tmp.name) / "leases")
        self.started = True
        self.engine.start()

    def root_pid(self) -> int | None:
        return self.engine.root_pid()

    @property
    def torchserve_url(self) -> str:
        return self.engine.predictions_url

    @property
    def metrics_url(self) -> str | None:
        return self.engine.metrics_url if self.engine.instance is not None else None

    def stop(self) -> None:
        if self.started:
            self.engine.stop()
            self.started = False
            if self._lease_dir is None:
                os.environ.pop("NEURONSERVE_LEASE_DIR", None)
            else:
                os.environ["NEURONSERVE_LEASE_DIR"] = self._lease_dir
        self.tmp.cleanup()


def layout_plan(artifact: Path, layout: str) -> placement.WorkerPlan:
    """The worker plan `neuronserve package` makes for a layout on this host."""
    return placement.plan(
        placement.PlanRequest.of(
            load_spec(None, {"layout": layout}), read_manifest(artifact, verify=False)
        )
    )


class SageMakerServer:
    """The SageMaker container entrypoint (`python -m neuronserve.serve.sagemaker`) in
    front of TorchServe, serving /ping and /invocations on a free port."""

    def __init__(self, artifact: Path, layout: str, engine: str = "torchserve"):
        self.artifact, self.layout, self.engine = Path(artifact), layout, engine
        plan = layout_plan(self.artifact, layout)
        self.workers, self.cores_per_worker = plan.workers, plan.cores_per_worker
        self.tmp = tempfile.TemporaryDirectory(prefix="ns-bench-sagemaker-")
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/invocations"

    def start(self, timeout_s: float = 600) -> None:
        work = Path(self.tmp.name)
        env = {
            **os.environ,
            "NEURONSERVE_MODEL_DIR": str(self.artifact.resolve()),
            "NEURONSERVE_ENGINE": self.engine,
            "NEURONSERVE_BIND": "127.0.0.1",
            "SAGEMAKER_BIND_TO_PORT": str(self.port),
            "NEURONSERVE_WORK_DIR": str(work),
            "SAGEMAKER_MODEL_SERVER_WORKERS": str(self.workers),
            "NEURONSERVE_CORES_PER_WORKER": str(self.cores_per_worker),
            "NEURONSERVE_LEASE_DIR": str(work / "leases"),
        }
        self.log = open(work / "sagemaker.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "neuronserve.serve.sagemaker"],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the SageMaker entrypoint exited: "
                    f"{(work / 'sagemaker.log').read_text()[-2000:]}"
                )
            try:
                if requests.get(f"http://127.0.0.1:{self.port}/ping", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the SageMaker entrypoint was not ready after {timeout_s:.0f}s")

    def root_pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            stop_tree(proc.pid, lambda: proc.send_signal(signal.SIGTERM), 120)
            proc.wait()
        self.proc = None
        if getattr(self, "log", None):
            self.log.close()
        self.tmp.cleanup()


def cpu_by_role(root_pid: int | None) -> dict[str, float]:
    """CPU seconds (user + system) so far of a server's process tree, by role: the
    frontend (TorchServe's Java process, tritonserver), the model workers (TorchServe's
    Python workers, Triton's Python stubs) and, for SageMaker, the entrypoint in front."""
    import psutil

    out: dict[str, float] = {}
    if root_pid is None:
        return out
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            name = " ".join(p.cmdline()[:2]) or p.name()
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "java" in name or "tritonserver" in name:
            role = "frontend"
        elif p.pid == root_pid:
            role = "sagemaker_front"
        else:
            role = "workers"
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


_PROM = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$")


def scrape(metrics_url: str, model: str) -> dict[str, float]:
    """TorchServe's Prometheus series for `model`, summed over their other labels: the
    frontend's counters (latencies in microseconds, request count) and the handler's
    running sums (NeuronServe*Ms, NeuronServeRequests)."""
    text = requests.get(f"{metrics_url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _PROM.match(line.strip())
        labels = m.group(2) if m else ""
        if m and (f'model_name="{model}"' in labels or f'ModelName="{model}"' in labels):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out
