"""Requests that reach the front together go to the workers together: the one rule by
which requests are joined.

A request for a model goes to the workers at once when no call with the same model,
parameters and truncation is at the workers. While one is, requests of the same kind that
reach the front in one turn of the event loop are sent together, as one call (up to the
model's largest compiled batch of texts), at the end of that turn, and the results are
handed back to each. So a lone request waits for nothing, and requests join only when the
front is busy enough to have several at once, which is when the per-request cost (the hop
to a worker) is what limits it. text-embeddings-inference's router batches for the same
reason.

A worker gives one result per text (`WorkerClient.run`), so a joined call's results
split by count. A request a worker refuses fails only itself: when a joined call is
refused, each of its requests is sent again alone, and each gets its own results or
error; workers that cannot take the call (5xx: full, failing) fail it for all, without
sending more.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from ...served import ServedModel
from ...tasks import RequestError, TaskRequest
from ...tracing import TRACING
from ...workers.answers import WorkerClient

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@dataclass
class _Waiting:
    request: TaskRequest
    results: asyncio.Future[Any]
    # its trace's span, which the joined call it goes in links to (None: not traced)
    traced: Any = None


@dataclass
class _Group:
    """The requests for one model, parameters and truncation that arrived in this turn."""

    key: tuple[Any, ...]
    client: WorkerClient
    model: ServedModel
    first: TaskRequest
    waiting: list[_Waiting] = field(default_factory=list)


class Coalescer:
    """`run` as `WorkerClient.run`, with the requests of one turn joined."""

    def __init__(self, on_call: Callable[[str, int], None] | None = None):
        """`on_call(model, requests)`: told of every call to the workers and how many requests
        it carries (the front's metrics)."""
        self._open: dict[tuple[Any, ...], _Group] = {}
        # calls at the workers, by key
        self._busy: dict[tuple[Any, ...], int] = {}
        self._calls: set[asyncio.Task[None]] = set()
        self._on_call = on_call

    async def run(self, client: WorkerClient, model: ServedModel, request: TaskRequest) -> Any:
        if model.max_batch <= 1:
            return await self._alone(client, model, request)
        try:
            kind = orjson.dumps(
                [request.parameters, request.truncate, request.truncation_direction],
                option=orjson.OPT_SORT_KEYS,
            )
        except TypeError:  # nothing a JSON body can carry; sent alone all the same
            return await self._alone(client, model, request)
        loop = asyncio.get_running_loop()
        # the loop is part of the key: a test client runs each request on a loop of its own
        key = (loop, id(client), model.worker_name, kind)
        group = self._open.get(key)
        if group is None:
            if key not in self._busy:
                return await self._at_once(key, client, model, request)
            group = _Group(key, client, model, request)
            self._open[key] = group
            loop.call_soon(self._send, key)
        # its call to the workers is in the trace of the request that opened the group, linked
        # to this request's
        with TRACING.span("joined"):
            waiting = _Waiting(request, loop.create_future(), TRACING.here())
            group.waiting.append(waiting)
            return await waiting.results

    async def _at_once(
        self, key: tuple[Any, ...], client: WorkerClient, model: ServedModel, request: TaskRequest
    ) -> Any:
        with self._at_workers(key):
            return await self._alone(client, model, request)

    @contextlib.contextmanager
    def _at_workers(self, key: tuple[Any, ...]) -> Iterator[None]:
        """A call of this kind is at the workers while the block runs."""
        self._busy[key] = self._busy.get(key, 0) + 1
        try:
            yield
        finally:
            left = self._busy[key] - 1
            if left:
                self._busy[key] = left
            else:
                del self._busy[key]

    def _send(self, key: tuple[Any, ...]) -> None:
        group = self._open.pop(key)
        for part in _parts(group.waiting, group.model.max_batch):
            call = asyncio.ensure_future(self._call(group, part))
            self._calls.add(call)  # held until done: the loop keeps only weak references
            call.add_done_callback(self._calls.discard)

    async def _call(self, group: _Group, part: list[_Waiting]) -> None:
        with self._at_workers(group.key):
            await self._join(group, part)

    async def _join(self, group: _Group, part: list[_Waiting]) -> None:
        if len(part) == 1:
            await self._answer(group, part[0])
            return
        texts = [t for w in part for t in w.request.texts]
        joined_request = dataclasses.replace(group.first, texts=texts, single=False)
        try:
            links = [w.traced for w in part]
            joined = await self._alone(group.client, group.model, joined_request, len(part), links)
            answers = _split(joined, [len(w.request.texts) for w in part])
        except (RequestError, _Unsplittable) as e:
            if isinstance(e, RequestError) and e.status >= 500:
                _fail(part, e)  # the workers's trouble (full, failing), not one request's
                return
            # one of them was refused (or the answer has no result per text): each alone,
            # so that only the one at fault hears of it
            await asyncio.gather(*(self._answer(group, w) for w in part))
            return
        except BaseException as e:  # the workers's failure is each request's
            _fail(part, e)
            if not isinstance(e, Exception):
                raise
            return
        counted = iter(joined_request.tokens or ())
        for w, answer in zip(part, answers, strict=True):
            # each request's share of the worker's token counts (OpenAI's usage)
            if joined_request.tokens is not None:
                w.request.tokens = [next(counted) for _ in w.request.texts]
            _settle(w, results=answer)

    async def _answer(self, group: _Group, waiting: _Waiting) -> None:
        try:
            answer = await self._alone(group.client, group.model, waiting.request)
        except BaseException as e:  # handed to the request that waits for it
            _settle(waiting, exception=e)
            if not isinstance(e, Exception):
                raise
            return
        _settle(waiting, results=answer)

    async def _alone(
        self,
        client: WorkerClient,
        model: ServedModel,
        request: TaskRequest,
        requests: int = 1,
        links: list[Any] | None = None,
    ) -> Any:
        if self._on_call is not None:
            self._on_call(model.name, requests)
        # a joined call is a span of the trace of the request whose turn sent it, linked
        # to the traces of the requests it carries
        with TRACING.span("workers.call", links, requests=requests,
                          texts=len(request.texts)):  # fmt: skip
            return await client.run(model, request)


class _Unsplittable(Exception):
    """A joined answer without one result per text."""


def _parts(waiting: list[_Waiting], cap: int) -> list[list[_Waiting]]:
    """`waiting` in arrival order, in parts of at most `cap` texts (a request over the
    cap on its own)."""
    parts: list[list[_Waiting]] = []
    size = cap
    for w in waiting:
        n = len(w.request.texts)
        if size + n > cap:
            parts.append([])
            size = 0
        parts[-1].append(w)
        size += n
    return parts


def _split(results: Any, sizes: list[int]) -> list[Any]:
    if not isinstance(results, (list, np.ndarray)) or len(results) != sum(sizes):
        raise _Unsplittable
    out, start = [], 0
    for n in sizes:
        out.append(results[start : start + n])
        start += n
    return out


def _fail(part: list[_Waiting], exception: BaseException) -> None:
    for w in part:
        _settle(w, exception=exception)


def _settle(waiting: _Waiting, results: Any = None, exception: BaseException | None = None) -> None:
    # a request cancelled meanwhile (its deadline, its client gone) takes nothing
    if waiting.results.done():
        return
    if isinstance(exception, asyncio.CancelledError):
        waiting.results.cancel()
    elif exception is not None:
        waiting.results.set_exception(exception)
    else:
        waiting.results.set_result(results)
