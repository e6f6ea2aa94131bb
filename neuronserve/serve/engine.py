"""Engine control: one engine (TorchServe or Triton) serving one artifact on loopback
ports of its own, packaged for this host's worker plan and started with truthful
readiness. The front (serve/front/, the SageMaker entrypoint too) runs one behind it;
bench starts one per layout it measures.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .. import placement
from ..artifact import read_manifest
from ..spec import DeploySpec, load_spec
from ..tasks import get_task
from ..worker import WorkerSettings
from .process import free_ports

log = logging.getLogger(__name__)

ENGINES = ("torchserve", "triton")
_PORTS = (
    "inference_port",
    "management_port",
    "metrics_port",
    "http_port",
    "grpc_port",
    "triton_metrics_port",
    "grpc_inference_port",
    "grpc_management_port",
)


# each engine's run directory (pid file, logs) inside an Engine's work folder
RUN_DIRS = {"torchserve": "ts", "triton": "tr"}


def running_instance(work: Path, engine: str) -> Any:
    """The engine an Engine started in `work` (its URLs), if it is running."""
    if engine == "torchserve":
        from . import torchserve

        return torchserve.running(Path(work) / RUN_DIRS[engine])
    from . import triton

    return triton.running(Path(work) / RUN_DIRS[engine])


def running_pid(work: Path, engine: str) -> int | None:
    """The main process (TorchServe's frontend, tritonserver) of the engine an Engine
    started in `work`, if it is running."""
    if engine == "torchserve":
        from .torchserve import server_pid

        return server_pid(Path(work) / RUN_DIRS[engine])
    inst = running_instance(work, engine)
    return inst.pid() if inst is not None else None


def workers_ready(work: Path, engine: str, name: str) -> tuple[int, int]:
    """(workers ready, workers expected) of model `name` in the engine started in `work`:
    TorchServe's READY workers; Triton's live stubs while the model is READY."""
    inst = running_instance(work, engine)
    if inst is None:
        return 0, 1
    if engine == "torchserve":
        import requests

        from .torchserve import worker_counts

        try:
            ready, expected, _ = worker_counts(inst, name)
        except (requests.RequestException, ValueError):
            return 0, 1
        return ready, expected
    import requests

    count = inst.instances().get(name)
    expected = count.expected if count else 1
    try:
        r = requests.get(f"{inst.http_url}/v2/models/{name}/ready", timeout=5)
    except requests.RequestException:
        return 0, expected
    return (count.alive if r.status_code == 200 and count else 0), expected


# the spec fields that shape an engine's workers; everything else (ports, folders) is
# the engine's own
ENGINE_FIELDS = (
    "layout",
    "workers",
    "cores_per_worker",
    "neuron_cores",
    "max_batch_delay_ms",
    "batch_requests",
    "response_timeout_s",
    "worker_retry_timeout_s",
    "max_queued",
    "queue_timeout_ms",
    "truncation",
    "max_client_batch",
)


def engine_settings(spec: DeploySpec, packaged: WorkerSettings | None) -> dict[str, Any]:
    """The engine settings a spec gives explicitly; truncation, if the spec leaves it, is
    what the model was packaged with (a .mar's or a Triton repository's)."""
    settings = {k: getattr(spec, k) for k in ENGINE_FIELDS if k in spec.model_fields_set}
    if "truncation" not in settings and packaged is not None:
        settings["truncation"] = packaged.truncation
    return {k: v for k, v in settings.items() if v is not None}


class Engine:
    """`engine` serving `artifact` from its own folders under `work`.

    `settings` are spec fields for this deployment (workers, cores_per_worker, layout,
    response_timeout_s, max_batch_delay_ms, ...); ports and folders are chosen here.
    """

    def __init__(self, engine: str, artifact: Path, work: Path, settings: dict[str, Any]):
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: choose {' or '.join(ENGINES)}")
        self.engine_name, self.work, self.artifact = engine, Path(work), Path(artifact)
        # packaging verifies the artifact's checksums when the engine starts
        self.manifest = read_manifest(artifact, verify=False)
        self.task = get_task(self.manifest.task)
        self.name = self.manifest.name
        self.spec: DeploySpec = load_spec(
            None,
            {
                "name": self.name,
                "artifact": artifact,
                # loopback only, behind the front: no keys, and a folder instead of a
                # zip so a start does not pack the artifact again
                "token_auth": False,
                "bind_address": "127.0.0.1",
                "archive_format": "no-archive",
                "model_store": self.work / "store",
                "run_dir": self.work / RUN_DIRS["torchserve"],
                "triton_repository": self.work / "repo",
                "triton_run_dir": self.work / RUN_DIRS["triton"],
                **dict(zip(_PORTS, free_ports(len(_PORTS)), strict=True)),
                **settings,
            },
        )
        self.plan = placement.plan(placement.PlanRequest.of(self.spec, self.manifest))
        self.instance: Any = None

    def start(self) -> None:
        """Package for this host and start; returns once every worker is ready."""
        s = self.spec
        if self.engine_name == "torchserve":
            from ..packaging.torchserve import package_torchserve
            from . import torchserve

            package_torchserve(self.artifact, s)
            self.instance = torchserve.start(s.model_store, s.run_dir, log=self._log)
        else:
            from ..packaging.triton import package_triton
            from . import triton

            package_triton(self.artifact, s)
            listen = triton.Listen(s.http_port, s.grpc_port, s.triton_metrics_port)
            self.instance = triton.start(
                s.triton_repository, s.triton_run_dir, listen, log=self._log
            )

    def _log(self, message: str) -> None:
        log.info(message)

    def stop(self) -> None:
        if self.engine_name == "torchserve":
            from . import torchserve

            torchserve.stop(self.spec.run_dir, log=self._log)
        else:
            from . import triton

            triton.stop(self.spec.triton_run_dir, log=self._log)

    def root_pid(self) -> int | None:
        """The engine's main process (TorchServe's frontend, tritonserver), if running."""
        return running_pid(self.work, self.engine_name) if self.instance is not None else None

    @property
    def metrics_url(self) -> str:
        return str(self.instance.metrics_url)

    @property
    def predictions_url(self) -> str:
        """TorchServe's inference URL for this model."""
        return f"{self.instance.inference_url}/predictions/{self.name}"
