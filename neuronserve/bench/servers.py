"""Servers `neuronserve bench` starts itself: each one only while it is measured, so
two servers never compete for the same cores, on free ports and with its own run
directories. TorchServe and Triton are packaged and started the way `neuronserve
package` and `neuronserve serve` do it (the SageMaker entrypoint's Backend); the
SageMaker front runs as the container entrypoint would, in its own process."""

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

from ..artifact import Manifest, read_manifest
from ..compile import get_target
from ..cores import group_count
from ..packaging.torchserve import apply_layout
from ..serve.sagemaker import Backend, _free_ports
from ..spec import load_spec


def layout_workers(manifest: Manifest, layout: str) -> tuple[int, int]:
    """(workers, cores per worker) for a layout on this host, as `neuronserve package`
    lays it out."""
    spec = apply_layout(load_spec(None, {"layout": layout}), manifest)
    kind = get_target(manifest.target).core_kind
    return spec.workers or group_count(kind, spec.cores_per_worker), spec.cores_per_worker


class ManagedServer:
    """TorchServe or Triton serving one artifact in the given layout."""

    def __init__(self, engine: str, artifact: Path, layout: str, max_batch_delay_ms: int | None,
                 batch_requests: int | None = None):
        self.engine, self.artifact, self.layout = engine, Path(artifact), layout
        # packaging verifies the artifact's checksums when the server starts
        self.manifest = read_manifest(self.artifact, verify=False)
        self.name = self.manifest.name
        self.workers, self.cores_per_worker = layout_workers(self.manifest, layout)
        self.max_batch_delay_ms, self.batch_requests = max_batch_delay_ms, batch_requests
        self.tmp = tempfile.TemporaryDirectory(prefix=f"ns-bench-{engine}-")
        self.backend: Backend | None = None
        self._lease_dir: str | None = None

    def start(self) -> None:
        backend = Backend(self.engine, self.artifact, self.manifest, Path(self.tmp.name),
                          self.workers, 300, self.cores_per_worker)
        if self.max_batch_delay_ms is not None:
            backend.spec.max_batch_delay_ms = self.max_batch_delay_ms
        if self.batch_requests is not None:
            backend.spec.batch_requests = self.batch_requests
        # workers inherit this process's environment: their own lease directory, put
        # back in stop()
        self._lease_dir = os.environ.get("NEURONSERVE_LEASE_DIR")
        os.environ["NEURONSERVE_LEASE_DIR"] = str(Path(self.tmp.name) / "leases")
        self.backend = backend
        backend.start()

    def root_pid(self) -> int | None:
        if self.backend is None:
            return None
        if self.engine == "torchserve":
            from ..serve.torchserve import _server_pid

            return _server_pid(Path(self.backend.spec.run_dir))
        return self.backend.instance.pid()

    @property
    def torchserve_url(self) -> str:
        return f"{self.backend.instance.inference_url}/predictions/{self.name}"

    @property
    def metrics_url(self) -> str | None:
        return getattr(self.backend.instance, "metrics_url", None)

    def stop(self) -> None:
        if self.backend is not None:
            self.backend.stop()
            self.backend = None
            if self._lease_dir is None:
                os.environ.pop("NEURONSERVE_LEASE_DIR", None)
            else:
                os.environ["NEURONSERVE_LEASE_DIR"] = self._lease_dir
        self.tmp.cleanup()


class SageMakerServer:
    """The SageMaker container entrypoint (`python -m neuronserve.serve.sagemaker`) in
    front of TorchServe, serving /ping and /invocations on a free port."""

    def __init__(self, artifact: Path, layout: str, engine: str = "torchserve"):
        self.artifact, self.layout, self.engine = Path(artifact), layout, engine
        self.workers, self.cores_per_worker = layout_workers(
            read_manifest(self.artifact, verify=False), layout)
        self.tmp = tempfile.TemporaryDirectory(prefix="ns-bench-sagemaker-")
        self.port = _free_ports(1)[0]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/invocations"

    def start(self, timeout_s: float = 600) -> None:
        work = Path(self.tmp.name)
        env = {**os.environ, "NEURONSERVE_MODEL_DIR": str(self.artifact.resolve()),
               "NEURONSERVE_ENGINE": self.engine, "NEURONSERVE_BIND": "127.0.0.1",
               "SAGEMAKER_BIND_TO_PORT": str(self.port), "NEURONSERVE_WORK_DIR": str(work),
               "SAGEMAKER_MODEL_SERVER_WORKERS": str(self.workers),
               "NEURONSERVE_CORES_PER_WORKER": str(self.cores_per_worker),
               "NEURONSERVE_LEASE_DIR": str(work / "leases")}
        self.log = open(work / "sagemaker.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "neuronserve.serve.sagemaker"],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the SageMaker entrypoint exited: "
                                   f"{(work / 'sagemaker.log').read_text()[-2000:]}")
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
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
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


_PROM = re.compile(r'^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$')


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
