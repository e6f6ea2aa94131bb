"""The contract every engine implements. TorchServe (torchserve.py) and Triton
(triton.py) are the two; `engines.py` names them; nothing else asks which one it talks to.

An engine packages an artifact into its store (a TorchServe model store, a Triton
repository), starts on that store from a run directory of its own (pid file, logs,
keys) and returns only once every worker is ready, reports how many workers of a model
are ready, where its own API takes a model's requests, and stops with every process it
started. The front, the SageMaker and Kubernetes entrypoints, bench, soak and doctor
use engines only through this class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from ..serve.process import ServeError

if TYPE_CHECKING:
    from ..placement import WorkerPlan
    from ..serve.front.clients import EngineClient
    from ..serve.front.model import ServedModel
    from ..spec import DeploySpec

Log = Callable[[str], object]


@dataclass(frozen=True)
class NativeRoute:
    """Where a client of the engine's own API sends one model's requests.

    `protocol`: "torchserve" (JSON `{"inputs", "parameters"}` posted to `url`, the task's
    JSON back), "triton-http" or "triton-grpc" (KServe v2 tensors: `url` is the server's
    address, `model` the model name).
    """

    protocol: str
    url: str
    model: str
    # what a request there must carry besides its body (TorchServe's key)
    headers: dict[str, str] = field(default_factory=dict)


# what an engine's start gives back: where it listens (TorchServeInstance, TritonInstance)
Instance = TypeVar("Instance")


class Engine(ABC, Generic[Instance]):
    """One engine, started (or to be started) from `run_dir`.

    Class attributes say what a deployment must give it: the spec fields of its ports and
    of its store, and what its worker processes are called in messages.
    """

    name: ClassVar[str]
    # the server's own name, in messages
    server: ClassVar[str]
    # TorchServe's "workers", Triton's "instances"
    worker_word: ClassVar[str]
    # the spec fields holding the ports it listens on
    port_fields: ClassVar[tuple[str, ...]]
    # the spec field holding the folder `package` writes and `start` serves
    store_field: ClassVar[str]
    # how a worker that died is replaced (shown by `serve` and in the docs)
    replacement: ClassVar[str]
    # neuronserve's pip extra that installs it (an image for it gets that extra)
    extra: ClassVar[str]
    # the protocols of its own API, one NativeRoute each (`native_routes`)
    protocols: ClassVar[tuple[str, ...]]
    # (package, file) of the adapter it ships into its store: what its workers run
    adapter: ClassVar[tuple[str, str]]

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir).resolve()
        self._instance: Instance | None = None

    # packaging: no server needed

    @classmethod
    def store(cls, spec: DeploySpec) -> Path:
        return Path(getattr(spec, cls.store_field))

    @classmethod
    @abstractmethod
    def package(cls, spec: DeploySpec, plan: WorkerPlan | None = None) -> Path:
        """Write the spec's models into its store for this host's worker plan (`plan`
        when the caller made it already), as one engine model whose workers each hold
        every model; the path written."""

    @classmethod
    @abstractmethod
    def models_in(cls, store: Path) -> list[str]:
        """The models a store holds: what `start` will serve from it."""

    # a running engine

    def start(self, spec: DeploySpec, log: Log = print, timeout_s: float = 600) -> None:
        """Start on the spec's store, listening where the spec says, and return once
        every worker of every model is ready (stopping again if that fails)."""
        self._instance = self._start(spec, log, timeout_s)

    def stop(self, log: Log = print) -> bool:
        """Stop it and wait until its processes are gone; False when none was running."""
        self._instance = None
        return self._stop(log)

    @property
    def instance(self) -> Instance:
        """Where the running engine listens."""
        if self._instance is None:
            self._instance = self._running()
        if self._instance is None:
            raise ServeError(f"no {self.server} is running from {self.run_dir}")
        return self._instance

    @abstractmethod
    def _start(self, spec: DeploySpec, log: Log, timeout_s: float) -> Instance: ...

    @abstractmethod
    def _stop(self, log: Log) -> bool: ...

    @abstractmethod
    def _running(self) -> Instance | None:
        """The engine started from run_dir, if it runs."""

    @abstractmethod
    def root_pid(self) -> int | None:
        """The engine's main process (TorchServe's frontend, tritonserver), if running."""

    @abstractmethod
    def workers_ready(self, model: str) -> tuple[int, int]:
        """(workers ready, workers planned) of `model`: only workers whose process is
        alive and has loaded the model count."""

    @abstractmethod
    def native_routes(self, model: str) -> list[NativeRoute]:
        """Where the engine's own API takes `model`'s requests, one per protocol."""

    @property
    @abstractmethod
    def metrics_url(self) -> str:
        """Base URL of its Prometheus endpoint (`/metrics` below it)."""

    @abstractmethod
    def client(
        self, name: str, models: dict[str, ServedModel], workers: int, connections: int
    ) -> EngineClient:
        """The front's asynchronous client for `models`, served under the engine model
        `name` by `workers` workers, with up to `connections` open."""

    def running(self) -> bool:
        return self.root_pid() is not None

    def describe(self) -> dict[str, Any]:
        """What `serve` prints: the engine, its run directory and how workers heal."""
        return {"engine": self.name, "run_dir": str(self.run_dir), "replacement": self.replacement}
