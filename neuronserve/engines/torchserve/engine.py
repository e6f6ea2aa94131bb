"""TorchServe as an engine: its Java frontend with one Python worker process per core
group (handlers/neuronserve_handler.py), token authorization as its section says (behind
the front: on, the front holding the keys), a dead worker replaced by TorchServe itself.
Process control is process.py, packaging package.py, the front's client client.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..base import Engine, EngineFacts, Log
from .section import TorchServeSection

if TYPE_CHECKING:
    from ...packaging.model import Packaged
    from ..base import FoundModel
    from ..client import EngineClient
    from .process import TorchServeInstance


class TorchServe(Engine["TorchServeInstance"]):
    facts = EngineFacts(
        server="TorchServe",
        worker_word="workers",
        replacement=(
            "TorchServe starts a new worker when one dies; it leases the core group the dead "
            "one held"
        ),
        extra="torchserve",
        # its frontend is Java
        server_process="java",
        worker_process="model_service_worker",
        metric_style="camel",
        counters=(
            "ts_inference_requests_total",
            "ts_queue_latency_microseconds",
            "ts_inference_latency_microseconds",
        ),
        protocols=("torchserve",),
        adapter=("neuronserve._handlers", "neuronserve_handler.py"),
        system_packages=("openjdk-17-jre-headless",),
        wrote=("{path}", "{path.parent}/config.properties"),
    )

    @property
    def own(self) -> TorchServeSection:
        return cast(TorchServeSection, self.section)

    def package(self, packaged: Packaged) -> Path:
        from .package import package_torchserve

        return package_torchserve(self.own, packaged)

    def _start(self, log: Log, timeout_s: float) -> TorchServeInstance:
        from .process import listen_overrides, start

        return start(
            self.own.model_store, self.run_dir, listen_overrides(self.own), timeout_s, log=log
        )

    def _stop(self, log: Log) -> bool:
        from .process import stop

        return stop(self.run_dir, log=log)

    def _running(self) -> TorchServeInstance | None:
        from .process import running

        return running(self.run_dir)

    def client(self, name: str, workers: int, connections: int) -> EngineClient:
        from .client import TorchServeClient, TorchServeUrls
        from .process import worker_counts_of

        inst = self.instance
        urls = TorchServeUrls(
            predict=f"{inst.inference_url}/predictions/{name}",
            model=f"{inst.management_url}/models/{name}",
            metrics=inst.metrics_url,
            inference_auth=inst.headers(),
            management_auth=inst.headers("management"),
        )
        return TorchServeClient(urls, workers, connections, worker_counts_of)

    @classmethod
    def models_in(cls, store: Path) -> list[str]:
        from .process import models_in

        return models_in(store)

    @classmethod
    def packaged_models(cls, folder: Path, work: Path) -> list[FoundModel] | None:
        from .package import packaged_models

        return packaged_models(folder, work)

    def ready_lines(self, instance: TorchServeInstance, stop_hint: str) -> list[str]:
        lines = [
            "TorchServe is ready:",
            f"  inference   {instance.inference_url}/predictions/<model>",
            f"  management  {instance.management_url}/models",
            f"  metrics     {instance.metrics_url}/metrics",
        ]
        if instance.keys:
            # the keys stay in their file: a terminal's scrollback and CI logs are not private
            keys = instance.run_dir / "key_file.json"
            lines.append(
                f"  token authorization is on: send -H 'Authorization: Bearer <key>' with the\n"
                f"  inference key (or the management key) from {keys}"
            )
        lines.append(f"  logs in {instance.log_dir}; stop with {stop_hint}")
        return lines
