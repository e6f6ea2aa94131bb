"""neuronserve's own engine: no server between the front and the cores. A supervisor
starts one worker process per core group (worker.py), each answering the front on a unix
socket of the run folder (wire.py); the front's client (client.py) keeps a connection to
each and sends a request to the worker with the fewest waiting. A worker that dies or
hangs is replaced alone by the supervisor (supervisor.py) while the others serve.
It has no API of its own: the front is its one door, so there is no `serve native`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..base import Engine, EngineFacts, Log
from .section import NativeSection

if TYPE_CHECKING:
    from ...packaging.model import Packaged
    from ..base import FoundModel
    from ..client import EngineClient
    from .process import NativeInstance


class Native(Engine["NativeInstance"]):
    # no API of its own, nothing beyond neuronserve's own requirements, and nothing shipped
    # into its store: its workers run neuronserve itself
    facts = EngineFacts(
        server="the native engine",
        worker_word="workers",
        replacement=(
            "the supervisor starts a new worker when one dies or hangs (one batch past "
            "response_timeout_s); it leases the core group the dead one held, and the front "
            "sends the dead one's requests once more to another"
        ),
        extra="",
        server_process="neuronserve.engines.native.supervisor",
        worker_process="neuronserve.engines.native.worker",
        # the front's copy of what each batch reported, in prometheus_client's names; no
        # queue or server-time counters: its queue is the worker's, and the time a request
        # spends there is the front's engine-call time on /metrics
        metric_style="prometheus",
    )

    @property
    def own(self) -> NativeSection:
        return cast(NativeSection, self.section)

    def package(self, packaged: Packaged) -> Path:
        from .package import package_native

        return package_native(self.own, packaged)

    def _start(self, log: Log, timeout_s: float) -> NativeInstance:
        from .process import start

        return start(self.own.store, self.run_dir, timeout_s, log)

    def _stop(self, log: Log) -> bool:
        from .process import stop

        return stop(self.run_dir, log=log)

    def _running(self) -> NativeInstance | None:
        from .process import running

        return running(self.run_dir)

    def client(self, name: str, workers: int, connections: int) -> EngineClient:
        from .client import NativeClient

        return NativeClient(name, self.run_dir, self.instance.workers)

    @classmethod
    def models_in(cls, store: Path) -> list[str]:
        from .store import models_in

        return models_in(store)

    @classmethod
    def packaged_models(cls, folder: Path, work: Path) -> list[FoundModel] | None:
        from .package import packaged_models

        return packaged_models(folder)

    def ready_lines(self, instance: NativeInstance, stop_hint: str) -> list[str]:
        from .supervisor import STATUS_FILE

        return [
            f"the native engine is ready: {instance.workers} worker(s), their sockets in "
            f"{instance.run_dir}",
            f"  states in {instance.run_dir / STATUS_FILE}; log in {instance.log}; "
            f"stop with {stop_hint}",
        ]
