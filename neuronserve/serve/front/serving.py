"""What the front's routes share: the workers' client once the workers are ready, the
served model's facts (read once from its manifest), the limits, and a short-lived
health answer so probes do not each call the workers."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...served import ServedModel
from ...tasks import RequestError, TaskRequest
from ...tasks.base import Text
from ...tracing import TRACING
from ...workers.answers import Answer, WorkerClient, WorkerCounts
from .coalescing import Coalescer
from .config import FrontConfig
from .observe import FrontMetrics
from .table import ModelTable, Version

if TYPE_CHECKING:
    from .multi_model import ModelCatalog

# how long one health answer from the workers is reused
HEALTH_TTL_S = 1.0
# texts with more characters than this in all are tokenized off the event loop
_INLINE_CHARS = 4096
# the request scope's note of the model version a request holds (Serving.lookup)
HELD = "neuronserve.model_held"
RELEASE = "neuronserve.model_release"


class NotReady(Exception):
    """The workers are still loading (or failed): answered 503 with Retry-After."""


@dataclass(frozen=True)
class Need:
    """Which models a route applies to: those of `tasks` (any task when empty) that pass
    `also`, described as `what` in errors."""

    tasks: tuple[str, ...] = ()
    also: Callable[[ServedModel], bool] | None = None
    what: str = "a model"

    def fits(self, model: ServedModel) -> bool:
        return (not self.tasks or model.task in self.tasks) and (
            self.also is None or self.also(model)
        )

    def why(self, model: ServedModel) -> str:
        return f"needs {self.what}; {model.name} is {model.task}"

    @classmethod
    def of(cls, *tasks: str) -> Need:
        return cls(tasks, None, f"a {' or '.join(tasks)} model")


ANY_MODEL = Need()


class Serving:
    """The table of served models and the workers' client once the workers are ready."""

    def __init__(self, config: FrontConfig, metrics: FrontMetrics | None = None):
        self.config = config
        self.metrics = metrics or FrontMetrics()
        self.client: WorkerClient | None = None
        self.table = ModelTable()
        self.exit_code = 0
        self._health: tuple[float, WorkerCounts] | None = None
        # multi-model: the policies that load, evict and swap the table's models
        self.catalog: ModelCatalog | None = None
        # multi-model: loading the models given at start (health says loading meanwhile)
        self.starting = False
        self._coalescer = Coalescer(self.metrics.worker_call)

    def attach(self, models: dict[str, ServedModel], client: WorkerClient) -> None:
        """The workers are ready: their client, and a fixed deployment's models, pinned."""
        for model in models.values():
            self.table.pin(model)
        self.client = client

    @property
    def models(self) -> dict[str, ServedModel]:
        """What requests can be routed to now, by name (the table's ready versions)."""
        return self.table.served()

    def info(self, name: str | None = None, alone: bool = False) -> dict[str, Any]:
        """text-embeddings-inference's Info of model `name` (default: the default model),
        and `models`: every served model's, each with its base URL; `alone`: that model's
        only (what a TEI serving it alone answers, at its own base URL)."""
        self.ready()
        c = self.config
        infos = {
            m.name: {**m.info(c.max_in_flight, c.max_client_batch), "base_url": base_url(m.name)}
            for m in self.models.values()
        }
        if self.catalog is not None:
            states = self.table.states()
            for n, i in infos.items():
                i["state"] = states.get(n, "ready")
            for n, state in states.items():
                if n not in infos:
                    infos[n] = {"model_id": n, "state": state, "base_url": base_url(n)}
        described = self.model("/info", name, ANY_MODEL, default=True) if infos else None
        first = infos[described.name] if described is not None else {}
        if alone:
            return first
        return {**first, "models": list(infos.values())}

    def default_model(self) -> ServedModel | None:
        """The model the root answers for when a request names none and several could:
        `front.default_model` while it is served, else the first served."""
        models = self.models
        named = self.config.default_model
        if named is not None and named in models:
            return models[named]
        return next(iter(models.values()), None)

    def ready(self) -> WorkerClient:
        if self.client is None or (not len(self.table) and self.catalog is None):
            raise NotReady
        return self.client

    async def lookup(  # noqa: PLR0913 - the route, the name, and how to choose
        self,
        route: str,
        name: str | None,
        need: Need,
        scope: MutableMapping[str, Any],
        ask: str = "the request's `model` field",
        default: bool = False,
    ) -> ServedModel:
        """`model(...)`, after loading a registered model that is not on the workers
        (multi-model); the request holds the model's version until it ends (`release`),
        so no eviction, swap or DELETE takes it from under the request."""
        if self.catalog is not None and name is not None:
            await self.catalog.ensure(name)
        model = self.model(route, name, need, ask, default)
        version = self.table.get(model.name)
        if version is not None:
            scope[HELD], scope[RELEASE] = self.table.hold(version), self.release
        return model

    def release(self, scope: MutableMapping[str, Any]) -> None:
        version: Version | None = scope.pop(HELD, None)
        if version is not None:
            self.table.release(version)

    def model(
        self,
        route: str,
        name: str | None,
        need: Need,
        ask: str = "the request's `model` field",
        default: bool = False,
    ) -> ServedModel:
        """The model a request to `route` names, or the one served model the route
        applies to when it names none. A 404 lists the served models for an unknown
        name; a model the route does not apply to is a 404 saying what it takes; a
        request that names none while several models fit is a 400 naming them, unless
        the route takes the `default` model then (the root's, which never asks)."""
        self.ready()
        if name is not None:
            model = self.models.get(name)
            if model is None:
                raise RequestError(
                    f"no model {name!r} here; served: {', '.join(self.models)}", status=404
                )
            if not need.fits(model):
                raise RequestError(f"{route} {need.why(model)}{self._fitting(need)}", status=424)
            return model
        fits = [m for m in self.models.values() if need.fits(m)]
        if len(fits) == 1:
            return fits[0]
        if default and fits:
            chosen = self.default_model()
            return chosen if chosen in fits else fits[0]
        # 424, as text-embeddings-inference answers a route its model does not serve
        if not fits:
            if len(self.models) == 1:
                raise RequestError(f"{route} {need.why(next(iter(self.models.values())))}", 424)
            raise RequestError(f"{route} needs {need.what}; {self._served()}", status=424)
        raise RequestError(
            f"{len(fits)} models here serve {route}: name one in {ask} "
            f"({', '.join(m.name for m in fits)})"
        )

    def _fitting(self, need: Need) -> str:
        fits = [m.name for m in self.models.values() if need.fits(m)]
        return f" (this server's {', '.join(fits)} would)" if fits else ""

    def _served(self) -> str:
        return "served: " + ", ".join(f"{m.name} ({m.task})" for m in self.models.values())

    async def predict(self, model: ServedModel, inputs: Any, parameters: dict[str, Any]) -> Answer:
        """The answer to `{"inputs": inputs, "parameters": parameters}` for `model`, the
        same way on every route: parsed and limited by the model's task here,
        its texts in calls of at most the model's largest compiled batch (joined with
        other requests that arrive at once: coalescing.py; spread over the workers that
        stand idle: `spread`; a request over max_client_batch refused, or split when the
        spec allows), the workers' results answered by the task here."""
        task = model.handler
        with TRACING.span("parse", model=model.name):
            request = task.parse(inputs, parameters)
            refused = model.limits.check(request) or model.chunks_refused(request)
        if refused is not None:
            raise refused
        started = time.perf_counter()
        with TRACING.span("workers", model=model.name, texts=len(request.texts)):
            results, calls = await self.results(model, request)
        self.metrics.te_inference.observe(time.perf_counter() - started)
        # each call to the workers bounded its own answer (max_answer_bytes); what no one foretold
        # (a SPLADE model's terms) is bounded once the calls are joined, when written
        with TRACING.span("answer"):
            value = task.respond(results, request, model.task_info)
        self.metrics.texts(model.name, request.tokens)
        return Answer(
            value=value,
            limits=self.config.answer_limits if calls > 1 else None,
            tokens=request.tokens,
        )

    async def results(self, model: ServedModel, request: TaskRequest) -> tuple[Any, int]:
        """`request`'s results (Task.finish's, one per text) from the workers, and in how
        many calls they came."""
        client = self.ready()
        texts = request.texts
        if len(texts) > self.config.max_client_batch and not self.config.split_client_batches:
            raise self.too_many(len(texts))
        calls = spread(len(texts), model.max_batch, client.idle())
        if calls == 1:
            return await self._coalescer.run(client, model, request), 1
        step = -(-len(texts) // calls)
        starts = range(0, len(texts), step)
        for i in starts:  # one request, in as many calls
            self.metrics.worker_call(model.name, 1 if i == 0 else 0)
        pieces = [
            dataclasses.replace(request, texts=texts[i : i + step], single=False) for i in starts
        ]
        parts = await asyncio.gather(*(client.run(model, piece) for piece in pieces))
        counted = [piece.tokens for piece in pieces]
        request.tokens = None if None in counted else [n for c in counted for n in c or ()]
        if all(isinstance(p, np.ndarray) for p in parts):
            return np.concatenate(parts), len(pieces)
        return [r for part in parts for r in part], len(pieces)

    def too_many(self, count: int) -> RequestError:
        return RequestError(
            f"{count} inputs in one request; this server takes at most "
            f"{self.config.max_client_batch} (max_client_batch): send fewer per request",
            status=413,
        )

    async def health(self) -> WorkerCounts:
        if self.client is None:
            return WorkerCounts(0, 0)
        now = time.monotonic()
        if self._health is None or now - self._health[0] > HEALTH_TTL_S:
            self._health = (now, await self.client.health())
        return self._health[1]

    async def count_tokens(
        self, model: ServedModel, texts: Sequence[Text], answer: Answer | None = None
    ) -> int:
        """Tokens the model reads for `texts`, its default prompt included (what OpenAI's
        usage reports): as the worker counted them for `answer` when it did,
        else counted here."""
        if answer is not None and answer.tokens is not None:
            return sum(answer.tokens)
        return sum(await self.token_counts(model, texts))

    async def token_counts(self, model: ServedModel, texts: Sequence[Text]) -> list[int]:
        """Tokens the model reads for each of `texts`, its default prompt included."""
        tokenizer = model.tokenizer
        if tokenizer is None:
            return [0] * len(texts)  # an image model reads no tokens
        prompted = model.prompted(list(texts), None)
        counts: list[int] = await off_loop(
            lambda: tokenizer.lengths(prompted), sum(len(t) for t in prompted if isinstance(t, str))
        )
        return counts


# every model has a base URL of its own, answering every TEI and OpenAI route as a TEI
# serving that model alone would (routes.py: the routes under it)
MODEL_BASE = "/models/{name}"


def base_url(name: str) -> str:
    """The path of model `name`'s own base URL."""
    return MODEL_BASE.format(name=name)


async def off_loop(fn: Callable[[], Any], chars: int) -> Any:
    """`fn()`, in a worker thread when its input is large enough to stall other requests."""
    return fn() if chars <= _INLINE_CHARS else await asyncio.to_thread(fn)


# texts a call must keep for a request to be spread over idle workers: below it the
# extra hop costs about what the shorter call saves
SPREAD_ROWS = 4


def spread(texts: int, max_batch: int, idle: int) -> int:
    """In how many calls a request of `texts` goes to the workers: as few as the largest
    compiled batch allows, or, while workers stand idle, one per idle worker (each of at
    least SPREAD_ROWS texts), so that a large request on a quiet server is not served by
    one core while the others wait."""
    fewest = -(-texts // max_batch)
    return max(1, fewest, min(idle, texts // SPREAD_ROWS))
