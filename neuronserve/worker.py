"""The contract between packaging and the workers: neuronserve's own (workers/) and the
adapters Triton and TorchServe run (handlers/, triton_backend/): the settings a packaged
deployment carries, under one set of names, one worker start, and how a worker serves
the several models it holds. The adapters import this module and nothing else of
neuronserve.

Packaging writes `WorkerSettings` into what the server loads (a `neuronserve` section
of a config that nests values, `as_section`; `neuronserve_*` string parameters of one
that does not, `as_parameters`) and the adapter reads it back with the same class.
`start_worker` then leases a core group, pins to it and only then loads a Runner per
model: thread pools and the Neuron runtime read their settings once, when they
initialise, so nothing here imports torch or the Neuron SDK before the pin. Every model
is loaded in this one process: on Neuron a NeuronCore belongs to one process ("Processes
do not share NeuronCores", NeuronCore allocation:
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/explore/core-allocation.html),
and several models loaded by one process share its cores.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from . import cores, placement
from .catalog import Follower
from .inflight import IN_FLIGHT, Countdown

if TYPE_CHECKING:
    from .execution import RunReport
    from .runtime import Runner
    from .tasks.base import RequestLimits

log = logging.getLogger(__name__)

# TorchServe: the section of model-config.yaml holding the settings
CONFIG_SECTION = "neuronserve"
# a config of flat string parameters (Triton's): the prefix of those holding them
PARAM_PREFIX = "neuronserve_"
# where each model's artifact sits in a packaged model folder: models/<name>/
MODELS_DIR = "models"
# how a request names its model: a request header (TorchServe) or a request parameter
# (Triton)
MODEL_HEADER = "X-Neuronserve-Model"
MODEL_PARAMETER = "model"
# a worker that cannot start logs one line with this, as the adapters' logs show it
FAILURE_MARKER = "neuronserve: worker failed to start:"
# the signal on which a Triton stub prints its Python threads' stacks into its log (a
# start that stalls: kill -USR1 <stub pid>)
STACKS_SIGNAL = signal.SIGUSR1
# a group of workers (Triton's instance group) named after the core group it serves: "cores<k>", its
# workers "cores<k>_<i>" (such a group's workers prefer that core group)
CORE_GROUP = "cores"


def core_group_name(index: int) -> str:
    """The name of a worker group for core group `index`."""
    return f"{CORE_GROUP}{index}"


def core_group_of(worker_name: str) -> int | None:
    """The core group a worker of a `core_group_name` group serves (its name is
    `cores<k>_0`), else None (a group of another shape)."""
    group, _, index = worker_name.rpartition("_")
    number = group.removeprefix(CORE_GROUP)
    if group.startswith(CORE_GROUP) and number.isdigit() and index == "0":
        return int(number)
    return None


def make_shared_memory_private() -> list[str]:
    """Make every shared-memory file this process maps (/dev/shm) readable and writable
    by its user only, and say which. An engine that hands a worker its requests through
    shared memory it made readable by all (Triton's Python backend: 0644) leaks them to
    other local users; called before the worker takes any request."""
    found: list[str] = []
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return found
    for line in maps:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if path.startswith("/dev/shm/") and path not in found:
            try:
                os.chmod(path, 0o600)
            except OSError:
                continue
            found.append(path)
    return found


class ModelSettings(BaseModel):
    """One model a worker holds."""

    name: str
    # its artifact folder, relative to the model directory the server hands the worker
    artifact: str
    # None: what the artifact's manifest recorded
    truncation: bool | None = None


class WorkerSettings(BaseModel):
    target: str
    core_kind: str
    cores_per_worker: int = 1
    neuron_cores: int | None = None
    # most texts one request may hold, characters one text may hold (None: no limit),
    # deepest JSON nesting of a body
    max_client_batch: int | None = None
    max_text_chars: int | None = None
    max_json_depth: int = 32
    # the largest answer one request may get, as JSON (None: no limit)
    max_answer_bytes: int | None = None
    # the most characters one request's texts may hold in all, as read (max_body_bytes)
    max_request_chars: int | None = None
    # the most chunks a request asking for chunking may make (max_chunks_per_request)
    max_chunks: int | None = None
    # every model each worker loads, in the order packaging was given them
    models: list[ModelSettings] = []
    # multi-model: the catalog folder whose wanted models the worker follows (catalog.py)
    catalog: str | None = None
    # batches a worker on a pipelined target holds at once (Runner.start)
    batches_in_flight: int = IN_FLIGHT

    def limits(self) -> RequestLimits:
        """What one request may hold and get back, as every worker checks it."""
        from .tasks.base import RequestLimits

        return RequestLimits(
            self.max_client_batch,
            self.max_text_chars,
            self.max_json_depth,
            self.max_answer_bytes,
            self.max_request_chars,
            self.max_chunks,
        )

    def as_section(self) -> dict[str, Any]:
        """The settings as one section of an engine config that nests values (YAML)."""
        return {CONFIG_SECTION: self.model_dump()}

    @classmethod
    def from_section(cls, config: dict[str, Any] | None) -> WorkerSettings:
        """From an engine config holding `as_section()` (the whole config is given)."""
        return cls.model_validate((config or {}).get(CONFIG_SECTION, {}))

    def as_parameters(self) -> dict[str, str]:
        """The settings as flat string parameters, each name prefixed (an engine config
        of string values: None is left out, the models as JSON)."""
        out = {}
        for k, v in self.model_dump().items():
            if v is None:
                continue
            text = (
                json.dumps(v)
                if k == "models"
                else str(v).lower()
                if isinstance(v, bool)
                else str(v)
            )
            out[PARAM_PREFIX + k] = text
        return out

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> WorkerSettings:
        """From an engine config's string parameters (`as_parameters`; others ignored)."""
        values: dict[str, Any] = {
            k[len(PARAM_PREFIX) :]: v for k, v in params.items() if k.startswith(PARAM_PREFIX)
        }
        if "models" in values:
            values["models"] = json.loads(values["models"])
        return cls.model_validate(values)


@dataclass
class Worker:
    lease: cores.CoreLease
    # every model this worker holds, by name, in packaging's order
    runners: dict[str, Runner]
    # seconds from the call to start_worker until the lease was held, and until ready
    leased_s: float = 0.0
    ready_s: float = 0.0
    # the model served first in the next batch that holds several (models take turns)
    _turn: int = 0
    # multi-model: the thread that loads and drops models as the catalog says
    follower: Follower | None = None
    # what one request may hold and get back (the spec's limits)
    limits: RequestLimits | None = None

    def describe(self) -> str:
        g = self.lease.group
        models = "; ".join(
            f"{name}: buckets {', '.join(b.key for b in r.grid.buckets)}"
            for name, r in self.runners.items()
        )
        return (
            f"pid {os.getpid()} leased {self.lease.kind} core group {g.index} (cores "
            f"{g.label}) after {self.leased_s:.2f}s; {models} loaded and warmed up, "
            f"ready after {self.ready_s:.2f}s"
        )

    @property
    def pipelined(self) -> bool:
        """Whether `start` returns once a batch is handed to the device's threads (every
        model's Runner pipelined: a NeuronCore), not after running it on the caller's
        thread (the CPU)."""
        return all(r.group_rows for r in self.runners.values())

    def runner(self, name: str | None) -> Runner:
        """The model a request names (`MODEL_HEADER`, `MODEL_PARAMETER`); with none named,
        the only one. A 404 naming the served models for an unknown name, a 400 naming
        them when the worker holds several and the request named none."""
        from .tasks import RequestError

        runners = self.runners  # one read: the catalog's thread may swap the dict
        if name is None or name == "":
            if len(runners) == 1:
                return next(iter(runners.values()))
            raise RequestError(
                f"this deployment serves {len(runners)} models: name one with the "
                f"{MODEL_HEADER} header (HTTP) or the `{MODEL_PARAMETER}` request "
                f"parameter (tensors): {', '.join(runners) or 'none loaded'}"
            )
        found = runners.get(name)
        if found is None:
            raise RequestError(
                f"no model {name!r} here; served: {', '.join(runners) or 'none'}", status=404
            )
        return found

    def start(
        self,
        requests: Sequence[tuple[Runner | None, Any]],
        report: Callable[[str, RunReport], None],
    ) -> Future[list[Any]]:
        """One batch of (the Runner a request was parsed for, the request or the
        RequestError it is answered with) as the server formed it, begun; the future
        holds each request's results (`Task.finish`'s) or its error, in order. Each
        model's requests go through its Runner in one call of their own (requests for
        different models never share a module run), the models taking turns at going
        first from batch to batch so a busy one does not always delay another. The
        future is done on return where every Runner serves on the caller's thread (the
        CPU); on a pipelined target it completes on the Runner's finishing thread, and
        the server may take its next batch meanwhile (`Runner.start`); an adapter that
        answers in place waits on it. A model that cannot begin (closed since the
        parse) fails its requests alone. `report(model, run report)` is called once
        per model served."""
        from .errors import internal_error
        from .execution import RunReport
        from .tasks import RequestError

        # refused before a model was found for it, or to be filled
        out: list[Any] = [r if isinstance(r, RequestError) else None for _, r in requests]
        done: Future[list[Any]] = Future()
        parts = Countdown(lambda: done.set_result(out))

        def served(idx: list[int], run: RunReport, runner: Runner, started: Future[Any]) -> None:
            try:
                for i, result in zip(idx, started.result(), strict=True):
                    out[i] = result
                report(runner.name, run)
            except Exception:
                log.exception("answering a batch")
                for i in idx:  # these requests fail, the batch's others do not
                    out[i] = internal_error("answering the batch")
            finally:
                parts.settle()

        for runner, idx in self._by_model(requests):
            run = RunReport()
            parts.add()
            try:
                started = runner.start([requests[i][1] for i in idx], run)
            except Exception:
                log.exception("serving %s", runner.name)
                for i in idx:
                    out[i] = internal_error(f"serving {runner.name}")
                parts.settle()
                continue
            started.add_done_callback(functools.partial(served, idx, run, runner))
        parts.close()
        return done

    def _by_model(
        self, requests: Sequence[tuple[Runner | None, Any]]
    ) -> list[tuple[Runner, list[int]]]:
        """Each model's requests (by index; not those refused already), the models in
        this batch's turn."""
        from .tasks import RequestError

        groups: dict[int, tuple[Runner, list[int]]] = {}
        for i, (runner, request) in enumerate(requests):
            if runner is not None and not isinstance(request, RequestError):
                groups.setdefault(id(runner), (runner, []))[1].append(i)
        order = list(groups.values())
        if len(order) > 1:
            k = self._turn % len(order)
            order = order[k:] + order[:k]
            self._turn += 1
        return order

    def stop(self) -> None:
        """Stop following the catalog, answer the batches in flight, release the cores."""
        if self.follower is not None:
            self.follower.stop()
        for runner in list(self.runners.values()):
            runner.close()
        self.lease.release()


def _follower(settings: WorkerSettings, worker: Worker, model_dir: Path) -> Follower:
    """What keeps `worker`'s models: one wanted set in both modes, the packaged models (a
    fixed deployment) or the catalog the front writes (multi-model)."""
    from .runtime import Runner

    def load(name: str, artifact: Path | str, truncation: bool | None) -> Runner:
        return Runner(
            model_dir / artifact,  # an absolute artifact path stays as it is
            truncation=truncation,
            cores=len(worker.lease.cores),
            limits=worker.limits,
            name=name,
            in_flight=settings.batches_in_flight,
        )

    return Follower(
        Path(settings.catalog) if settings.catalog is not None else None,
        worker.lease.group.index,
        load,
        lambda: worker.runners,
        lambda models: setattr(worker, "runners", models),
        fixed={
            m.name: {"artifact": m.artifact, "truncation": m.truncation} for m in settings.models
        },
    )


def start_worker(
    settings: WorkerSettings, model_dir: Path | str, owner: str, prefer: int | None = None
) -> Worker:
    """Lease a core group of this host's plan, pin this process to it, then load and
    warm up every model of `settings` from `model_dir` on those cores. Raises
    NoFreeCoreGroup (naming what to change) when every group is held by a live worker.

    `prefer` is the group a worker with a known index should get (Triton's instance
    index); TorchServe gives its workers none, so they take the first free group.
    """
    started = time.monotonic()
    lease = placement.claim(
        settings.core_kind,
        settings.cores_per_worker,
        owner=owner,
        prefer=prefer,
        neuron_cores=settings.neuron_cores,
    )
    leased = time.monotonic() - started
    try:
        cores.pin(lease)
        if not settings.models and settings.catalog is None:
            raise ValueError("the packaged settings name no model to load")
        worker = Worker(lease, {}, leased, limits=settings.limits())
        follower = _follower(settings, worker, Path(model_dir))
        follower.start()
        if settings.catalog is not None:
            worker.follower = follower
    except BaseException:
        lease.release()
        raise
    worker.ready_s = time.monotonic() - started
    return worker


# What the adapters use of the rest of neuronserve, named here so that they import this
# module alone; each loaded on its first use, after the pin (numpy and the tokenizers
# start thread pools that read their settings once, when they load)
_FOR_ADAPTERS = {
    "RequestError": "neuronserve.errors",
    "TaskRequest": "neuronserve.tasks",
    "internal_error": "neuronserve.errors",
    "truncation_parameters": "neuronserve.tasks.base",
    "METRICS": "neuronserve.metrics",
    "MODEL_LABEL": "neuronserve.metrics",
    "DeferredMetrics": "neuronserve.metrics",
    "batch_values": "neuronserve.metrics",
    "camel": "neuronserve.metrics",
    "handler_values": "neuronserve.metrics",
}


def __getattr__(name: str) -> Any:
    module = _FOR_ADAPTERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
