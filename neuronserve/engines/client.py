"""What the front asks of the engine behind it: one small interface (`EngineClient`) that
every engine's client implements fully (answer a native request, pass a SageMaker body
through, say how many workers are ready, hand over its metrics), and what they share (an
answer kept as it came, a worker that died with a request, sending it once more). Each
engine makes its own client (engines/<engine>/client.py, `Engine.client`).

A native request is `{"inputs", "parameters"}` and its answer the task's JSON. Clients
are pooled and asynchronous, on aiohttp: httpx cost an order of magnitude more CPU per
request (the development guide's observations).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import aiohttp
import orjson

from ..tasks import RequestError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..served import ServedModel
    from ..tasks import TaskRequest
    from ..tasks.base import RequestLimits

log = logging.getLogger("neuronserve.front")
T = TypeVar("T")
_UNSET: Any = object()
# health and metrics calls: an engine that takes longer than this is not healthy
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=5)


# aiohttp offers gzip by default, and Triton then compresses every answer for a client on
# the same host, costing CPU on both sides of a loopback connection
PLAIN = {"Accept-Encoding": "identity"}


class EngineUnavailable(RuntimeError):
    """The engine did not answer at all (stopped, restarting, refused the connection)."""


class WorkerDied(EngineUnavailable):
    """The worker (instance) that held the request died with it: another may answer it."""

    def __init__(self, message: str, worker: str = ""):
        super().__init__(message)
        self.worker = worker  # the engine's name for it, where it says


async def once_more(
    call: Callable[[], Awaitable[T]],
    what: str,
    settle: Callable[[WorkerDied], Awaitable[None]] | None = None,
) -> T:
    """`call()`, and once more if its worker died under it, to another worker, once
    `settle` has waited for the engine to stop handing the dead one work (an engine that
    never does so gives none). So a client sees no failure for a killed worker unless
    every worker is gone (then 503, Retry-After)."""
    try:
        return await call()
    except WorkerDied as e:
        log.warning("%s: %s; sent again", what, e)
        if settle is not None:
            await settle(e)
        return await call()


class EngineAnswer:
    """The JSON answer to one request, kept as the values the task answered and written
    once, when a route needs the bytes."""

    __slots__ = ("_limits", "_raw", "_value", "tokens")

    def __init__(
        self,
        raw: bytes | None = None,
        value: Any = _UNSET,
        limits: RequestLimits | None = None,
        tokens: list[int] | None = None,
    ):
        self._raw, self._value, self._limits = raw, value, limits
        # the tokens the model read of each text, as the engine's worker counted them
        # (None: the engine did not say)
        self.tokens = tokens

    @property
    def raw(self) -> bytes:
        """The answer as sent; a RequestError (413) when it is larger than `limits` let
        one answer be (max_answer_bytes)."""
        if self._raw is None:
            raw = orjson.dumps(self._value, option=orjson.OPT_SERIALIZE_NUMPY)
            if self._limits is not None:
                refused = self._limits.check_answer(len(raw), "as written")
                if refused is not None:
                    raise refused
            self._raw = raw
        return self._raw

    @property
    def value(self) -> Any:
        if self._value is _UNSET:
            self._value = orjson.loads(self._raw or b"null")
        return self._value


@dataclass(frozen=True)
class WorkerCounts:
    """Workers (instances) ready of those the plan has: the engine's health."""

    ready: int
    expected: int

    @property
    def ok(self) -> bool:
        return self.expected > 0 and self.ready >= self.expected


class EngineClient(ABC):
    """What the front asks of an engine: one request's results, its health, its metrics.
    The front parses, limits, splits, joins and answers every request itself (Serving):
    a client only carries a request's texts to the engine's workers and their results
    back, in the engine's wire format."""

    # the engine's name (its package's, as Engine.name), said in traces and /metrics
    kind: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # engines/<name>/client.py; a client made elsewhere (a test's) names itself
        package = cls.__module__.split(".")
        if "kind" not in cls.__dict__ and package[:2] == ["neuronserve", "engines"]:
            cls.kind = package[2]

    # what the engine's own batcher counts: texts (the rows of a call: joining requests
    # into one call fills its batches) or requests (each call one batch slot, however many
    # texts it carries: joined calls make its batches uneven and leave workers idle, so
    # each request goes as it came and the engine batches them). The one rule by which
    # the front joins requests (coalescing.py) reads this and nothing else of the engine.
    batches: Literal["texts", "requests"] = "texts"

    @abstractmethod
    async def run(self, model: ServedModel, request: TaskRequest) -> Any:
        """`model`'s results for `request` (what `Task.finish` gives: one per text, in
        order): its texts, their truncation and the task's own parameters, in one call of
        at most the model's largest compiled batch (Serving splits beyond it); raises
        RequestError with the engine's status for a request it refused."""

    @abstractmethod
    async def health(self) -> WorkerCounts:
        """How many workers (instances) are ready, of how many the plan has."""

    @abstractmethod
    async def metrics(self) -> str:
        """The engine's own Prometheus text."""

    @abstractmethod
    async def close(self) -> None: ...


def engine_error(status: int, body: bytes) -> RequestError:
    """The RequestError for an engine's non-200 answer: our handler's `{"code", "error"}`
    or TorchServe's own `{"code", "type", "message"}`."""
    message = body.decode("utf-8", "replace")
    try:
        data = orjson.loads(body)
        if isinstance(data, dict):
            message = str(data.get("error") or data.get("message") or message)
    except orjson.JSONDecodeError:
        pass
    return RequestError.from_engine(message, status)


async def metrics_text(session: aiohttp.ClientSession, url: str) -> str:
    """An engine's Prometheus text, or a comment saying why there is none."""
    try:
        async with session.get(url, timeout=PROBE_TIMEOUT) as r:
            return await r.text()
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        return f"# the engine's metrics at {url} did not answer: {type(e).__name__}\n"
