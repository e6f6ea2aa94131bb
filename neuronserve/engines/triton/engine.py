"""Triton as an engine: tritonserver with one Python-backend stub process per instance
(core group) running triton_backend/model.py, its restricted APIs behind an admin key, in
a /dev/shm of its own, and a healer beside it that replaces a dead instance alone.
Process control is process.py, healing healer.py, packaging package.py, the front's
client client.py (KServe v2 binary tensors, kserve.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..base import Engine, EngineFacts, Log
from .section import TritonSection

if TYPE_CHECKING:
    from ...packaging.model import Packaged
    from ..base import FoundModel
    from ..client import EngineClient
    from .process import TritonInstance


class Triton(Engine["TritonInstance"]):
    facts = EngineFacts(
        server="tritonserver",
        worker_word="instances",
        replacement=(
            "Triton's Python backend never replaces a dead stub: the healer beside the server "
            "replaces that instance alone (the others serve on); the new one leases the freed "
            "core group"
        ),
        extra="triton",
        server_process="tritonserver",
        worker_process="triton_python_backend_stub",
        counters=(
            "nv_inference_request_success",
            "nv_inference_queue_duration_us",
            "nv_inference_request_duration_us",
        ),
        protocols=("triton-http", "triton-grpc"),
        adapter=("neuronserve._triton_backend", "model.py"),
        wrote=("{path}/config.pbtxt, {path}/1/model.py and {path}/1/models",),
        # Triton's HTTP API passes a header on only when told to (--http-header-forward-pattern)
        model_named_by='the `model` request parameter ({"parameters": {"model": ...}})',
    )

    @property
    def own(self) -> TritonSection:
        return cast(TritonSection, self.section)

    def package(self, packaged: Packaged) -> Path:
        from .package import package_triton

        return package_triton(self.own, packaged)

    def _start(self, log: Log, timeout_s: float) -> TritonInstance:
        from .process import Listen, start

        s = self.own
        listen = Listen(s.http_port, s.grpc_port, s.metrics_port, s.bind_address, s.inference_key)
        return start(s.repository, self.run_dir, listen, timeout_s, log=log, host_shm=s.host_shm)

    def _stop(self, log: Log) -> bool:
        from .process import stop

        return stop(self.run_dir, log=log)

    def _running(self) -> TritonInstance | None:
        from .process import running

        return running(self.run_dir)

    def stuck(self) -> str | None:
        inst = self.running()
        if inst is None:
            return super().stuck()
        wedged = inst.wedged()
        return "; ".join(f"{model}: {why}" for model, why in wedged.items()) or None

    def client(self, name: str, workers: int, connections: int) -> EngineClient:
        from .client import TritonClient, TritonUrls

        inst = self.instance

        def live() -> int:
            count = inst.instances().get(name)
            return count.alive if count else 0

        urls = TritonUrls(http=inst.http_url, metrics=inst.metrics_url, auth=inst.headers())
        return TritonClient(
            name,
            urls,
            workers,
            connections,
            live,
            lambda instance: inst.out_of_rotation(name, instance),
        )

    @classmethod
    def models_in(cls, store: Path) -> list[str]:
        from .process import models_in

        return models_in(store) if Path(store).is_dir() else []

    @classmethod
    def packaged_models(cls, folder: Path, work: Path) -> list[FoundModel] | None:
        from .package import packaged_models

        return packaged_models(folder)

    def ready_lines(self, instance: TritonInstance, stop_hint: str) -> list[str]:
        from .process import HEALER_LOG, HEALER_STATUS_FILE

        return [
            "tritonserver is ready:",
            f"  HTTP     {instance.http_url}/v2/models/<model>/infer",
            f"  gRPC     {instance.grpc_url}",
            f"  metrics  {instance.metrics_url}/metrics",
            f"  healer   replaces an instance whose stub dies ({instance.run_dir / HEALER_LOG}, "
            f"state in {instance.run_dir / HEALER_STATUS_FILE})",
            f"  log in {instance.log}; stop with {stop_hint}",
        ]
