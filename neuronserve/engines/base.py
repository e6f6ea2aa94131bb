"""The contract every engine implements, and the only way the rest of neuronserve reaches
an engine. Triton (engines/triton/), TorchServe (engines/torchserve/) and neuronserve's
own (engines/native/) are the three; the registry (registry.py) names them.

Five methods are what its users call:

    package(packaged)    write the prepared deployment into its store
    start(log, timeout)  start on its store, return once every worker is ready
    client(...)          the front's asynchronous client of it (engines/client.py): how
                         many workers are ready is the client's to say
    stuck()              why only a restart can mend it (None: it is whole)
    stop(log)            stop it and wait until every process it started is gone

What an engine's package implements, all of it (21 members, each documented where it is
declared):

- `Engine` (here): `facts` (what it is: `EngineFacts`; its name is its package's);
  `package`, `_start`, `_stop`, `_running`, `client`; its store read back: `models_in`,
  `packaged_models`; what `serve` prints: `ready_lines`. It may override `stuck`.
- what `start` returns (`Running`, here): `run_dir`, `metrics_url`, `pid`,
  `native_routes`.
- its spec section (section.py, `EngineSection`): `missing`, beside its own fields, which
  say what they are to a deployment (`flags`: the store, the ports, what a front or a
  container sets).
- its client (client.py, `EngineClient`; its `kind` is the engine's name): `batches`,
  `run`, `health`, `metrics`, `close`.
- what bench and soak need of its own API (bench.py, `EngineBench`): `endpoint`, `soak`.

It runs from a run folder of its own (pid file, logs, keys).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from ..processes import ServeError
from ..registry import class_name
from ..section import EngineSection
from ..sources import FoundModel, ModelSourceError
from ..worker import WorkerSettings

if TYPE_CHECKING:
    from ..packaging.model import Packaged
    from .client import EngineClient

Log = Callable[[str], object]


def packaged(model_dir: Path, settings: WorkerSettings) -> list[FoundModel]:
    """The models an engine's model folder holds, from the settings packaged with them."""
    if not settings.models:
        raise ModelSourceError(f"{model_dir} was packaged without the models it holds")
    return [FoundModel(model_dir / m.artifact, m.name, m.truncation) for m in settings.models]


@dataclass(frozen=True)
class NativeRoute:
    """Where a client of the engine's own API sends one model's requests.

    `protocol`: one of the engine's `protocols`, which its bench endpoints know how to
    speak (engines/<engine>/bench.py); `url` the address, `model` the model's name there.
    """

    protocol: str
    url: str
    model: str
    # what a request there must carry besides its body (a key)
    headers: dict[str, str] = field(default_factory=dict)


class Running(Protocol):
    """What a started engine offers others: its main process (TorchServe's frontend,
    tritonserver; None once gone), the base URL of its Prometheus endpoint, and where its
    own API takes a model's requests (one route per protocol)."""

    run_dir: Path
    metrics_url: str

    @property
    def pid(self) -> int | None: ...

    def native_routes(self, model: str) -> list[NativeRoute]: ...


# what an engine's start gives back: where it listens
Instance = TypeVar("Instance", bound=Running)


@dataclass(frozen=True)
class EngineFacts:
    """What an engine is, as the rest of neuronserve reads it: the words the CLI and docs
    use, what an image installs for it, what its processes are called, its own API."""

    # the server's own name ("tritonserver"; the native engine: "the native engine")
    server: str
    # what its workers are called: TorchServe's "workers", Triton's "instances"
    worker_word: str
    # how a worker that died is replaced (shown by `serve` and in the docs)
    replacement: str
    # neuronserve's pip extra that installs it (an image for it gets that extra)
    extra: str
    # what its processes' command lines hold: its main process, each worker (bench and
    # soak tell them apart by these)
    server_process: str
    worker_process: str
    # how its metrics name neuronserve's (metrics.Metric.named), and its own counters of
    # (requests served, their summed queue time, their summed time in the server), in
    # microseconds (empty: it has none; the front's engine-call time stands for them)
    metric_style: str = "snake"
    counters: tuple[str, str, str] = ("", "", "")
    # the protocols of its own API, one NativeRoute each (none: the front is its door)
    protocols: tuple[str, ...] = ()
    # (package, file) of the adapter it ships into its store: what its workers run (None:
    # its workers run neuronserve's own modules)
    adapter: tuple[str, str] | None = None
    # the system (apt) packages it needs beyond Python's: an image for it installs them
    system_packages: tuple[str, ...] = ()
    # what `neuronserve package <engine>` says it wrote, each line formatted with the
    # path `package` returned (`{path}`, `{path.parent}`)
    wrote: tuple[str, ...] = ("{path}",)
    # how a request to a package of several models names its model
    model_named_by: str = (
        "the X-Neuronserve-Model header on HTTP, the `model` request parameter on tensor APIs"
    )


class Engine(ABC, Generic[Instance]):
    """One engine, made from its spec section and run from `run_dir` (the section's
    own, unless the caller gives one), and what it is (`facts`). Its name is its
    package's under engines/, the registry's key; its section class the registry's."""

    name: ClassVar[str]
    facts: ClassVar[EngineFacts]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # engines/<name>/engine.py: the name the registry lists it by, said once
        cls.name = cls.__module__.split(".")[-2]

    def __init__(self, section: EngineSection, run_dir: Path | None = None):
        self.section = section
        self.run_dir = Path(run_dir if run_dir is not None else section.run_dir).resolve()
        self._instance: Instance | None = None

    # the five

    @abstractmethod
    def package(self, packaged: Packaged) -> Path:
        """Write `packaged` (the deployment as `packaging.model.prepare` resolved it: its
        verified models and their names, the worker plan, the workers' settings, the worker
        and limits sections) into the store its section names, as one engine model whose
        workers each hold every model; the path written."""

    def start(self, log: Log = print, timeout_s: float = 600) -> Instance:
        """Start on the section's store, listening where it says, and return once every
        worker of every model is ready (stopping again if that fails)."""
        from ..processes import ServeError

        refusal = self.section.missing()
        if refusal is not None:
            raise ServeError(refusal)
        self._instance = self._start(log, timeout_s)
        return self._instance

    @abstractmethod
    def client(self, name: str, workers: int, connections: int) -> EngineClient:
        """The front's asynchronous client of the engine model `name` (which holds
        every model of the deployment), served by `workers` workers, with up to
        `connections` open."""

    def stuck(self) -> str | None:
        """Why the engine started here can no longer be made whole without a restart
        (None: it is whole, or mends itself), the front then restarting it: here, that
        its server is gone (a crash; its workers' own deaths each engine heals)."""
        if self.running() is None:
            return f"{self.facts.server} is no longer running"
        return None

    def stop(self, log: Log = print) -> bool:
        """Stop it and wait until its processes are gone; False when none was running."""
        self._instance = None
        return self._stop(log)

    # a running engine

    def running(self) -> Instance | None:
        """The engine started from run_dir, if it runs."""
        if self._instance is None or self._instance.pid is None:
            self._instance = self._running()
        return self._instance

    @property
    def instance(self) -> Instance:
        found = self.running()
        if found is None:
            raise ServeError(f"no {self.facts.server} is running from {self.run_dir}")
        return found

    @abstractmethod
    def _start(self, log: Log, timeout_s: float) -> Instance: ...

    @abstractmethod
    def _stop(self, log: Log) -> bool: ...

    @abstractmethod
    def _running(self) -> Instance | None: ...

    # its store

    @classmethod
    @abstractmethod
    def models_in(cls, store: Path) -> list[str]:
        """The models a store holds: what `start` will serve from it."""

    @classmethod
    @abstractmethod
    def packaged_models(cls, folder: Path, work: Path) -> list[FoundModel] | None:
        """The artifacts a store this engine's `package` wrote holds in `folder`, with
        the settings they were packaged with (an archive unpacked into `work` first);
        None when `folder` is no store of this engine's."""

    # what the CLI says

    @abstractmethod
    def ready_lines(self, instance: Instance, stop_hint: str) -> list[str]:
        """What `serve <engine>` prints once it is ready (`stop_hint`: the command that
        stops it)."""

    def describe(self) -> dict[str, Any]:
        """What `serve` prints: the engine, its run directory and how workers heal."""
        return {
            "engine": self.name,
            "run_dir": str(self.run_dir),
            "replacement": self.facts.replacement,
        }


def engine_class(name: str) -> type[Engine[Any]]:
    """The Engine class of engine `name` (the registry's), its module imported now."""
    found: type[Engine[Any]] = getattr(
        importlib.import_module(f"{__package__}.{name}.engine"), class_name(name)
    )
    return found
