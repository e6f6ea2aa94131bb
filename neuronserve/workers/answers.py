"""What the front asks of its workers: one small interface (`WorkerClient`: answer a
request, say how many workers are ready, hand over their metrics) that the workers'
client (client.py) implements, and what goes with it (an answer kept as it came, a worker
that died with a request, sending it once more)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..served import ServedModel
    from ..tasks import TaskRequest
    from ..tasks.base import RequestLimits

log = logging.getLogger("neuronserve.front")
T = TypeVar("T")
_UNSET: Any = object()


class WorkersUnavailable(RuntimeError):
    """No worker answered at all (stopped, restarting, refused the connection)."""


class WorkerDied(WorkersUnavailable):
    """The worker that held the request died with it: another may answer it."""

    def __init__(self, message: str, worker: str = ""):
        super().__init__(message)
        self.worker = worker


async def once_more(
    call: Callable[[], Awaitable[T]],
    what: str,
    settle: Callable[[WorkerDied], Awaitable[None]] | None = None,
) -> T:
    """`call()`, and once more if its worker died under it, to another worker, once
    `settle` has waited for the dead one to be handed no more work. So a client sees no
    failure for a killed worker unless every worker is gone (then 503, Retry-After)."""
    try:
        return await call()
    except WorkerDied as e:
        log.warning("%s: %s; sent again", what, e)
        if settle is not None:
            await settle(e)
        return await call()


class Answer:
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
        # the tokens the model read of each text, as the worker counted them (None: it
        # did not say)
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
    """Workers ready of those the plan has."""

    ready: int
    expected: int

    @property
    def ok(self) -> bool:
        return self.expected > 0 and self.ready >= self.expected


class WorkerClient(ABC):
    """What the front asks of its workers: one request's results, their health, their
    metrics. The front parses, limits, splits, joins and answers every request itself
    (Serving): a client only carries a request to a worker and its results back."""

    @abstractmethod
    async def run(self, model: ServedModel, request: TaskRequest) -> Any:
        """`model`'s results for `request` (what `Task.finish` gives: one per text, in
        order): its texts, their truncation and the task's own parameters, in one call of
        at most the model's largest compiled batch (Serving splits beyond it); raises
        RequestError with the worker's status for a request it refused."""

    def idle(self) -> int:
        """Workers that answer and have no request of the front's at them now: what one
        large request may be spread over."""
        return 0

    @abstractmethod
    async def health(self) -> WorkerCounts:
        """How many workers are ready, of how many the plan has."""

    @abstractmethod
    async def metrics(self) -> str:
        """The workers' own Prometheus text."""

    @abstractmethod
    async def close(self) -> None: ...
