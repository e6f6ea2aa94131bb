"""Requests that reach the front together go to the engine together.

A request for a model goes to the engine at once when no call with the same model and
parameters is at the engine. While one is, requests of the same kind that reach the
engine call in one turn of the event loop are sent together, as one call (up to the
largest batch the engine takes in one, `EngineClient.join_limit`), at the end of that
turn, and the answer's rows are handed back to each. So a lone request waits for
nothing, and requests join only when the front is busy enough to have several at once,
which is when the engine's per-request cost (HTTP, the worker's protocol, JSON) is what
limits it. text-embeddings-inference's router batches for the same reason.

An engine answers a list of inputs with one row per input (the contract
`Serving.predict`'s splitting relies on too), so a joined answer splits by count. A
request the engine refuses fails only itself: when a joined call is refused, each of its
requests is sent again alone, and each gets its own answer or error; an engine that
cannot take the call (5xx: full, failing) fails it for all, without sending more.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from ...tasks import RequestError
from .clients import EngineAnswer, EngineClient
from .model import ServedModel

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@dataclass
class _Waiting:
    inputs: list[Any]
    answer: asyncio.Future[EngineAnswer]


@dataclass
class _Group:
    """The requests for one model and parameters that arrived in this turn."""

    key: tuple[Any, ...]
    client: EngineClient
    model: ServedModel
    parameters: dict[str, Any]
    cap: int
    waiting: list[_Waiting] = field(default_factory=list)


class Coalescer:
    """`predict` as `EngineClient.predict`, with the requests of one turn joined."""

    def __init__(self, on_call: Callable[[str, int], None] | None = None):
        """`on_call(model, requests)`: told of every engine call and how many requests
        it carries (the front's metrics)."""
        self._open: dict[tuple[Any, ...], _Group] = {}
        # calls at the engine, by key
        self._busy: dict[tuple[Any, ...], int] = {}
        self._calls: set[asyncio.Task[None]] = set()
        self._on_call = on_call

    async def predict(
        self, client: EngineClient, model: ServedModel, inputs: list[Any], parameters: dict
    ) -> EngineAnswer:
        cap = client.join_limit(model.worker_name)
        if cap <= 1:
            return await self._alone(client, model, inputs, parameters)
        try:
            params_key = orjson.dumps(parameters, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # nothing a JSON body can carry; sent alone all the same
            return await self._alone(client, model, inputs, parameters)
        loop = asyncio.get_running_loop()
        # the loop is part of the key: a test client runs each request on a loop of its own
        key = (loop, id(client), model.worker_name, params_key)
        group = self._open.get(key)
        if group is None:
            if key not in self._busy:
                return await self._at_once(key, client, model, inputs, parameters)
            group = _Group(key, client, model, parameters, cap)
            self._open[key] = group
            loop.call_soon(self._send, key)
        waiting = _Waiting(inputs, loop.create_future())
        group.waiting.append(waiting)
        return await waiting.answer

    async def _at_once(
        self,
        key: tuple[Any, ...],
        client: EngineClient,
        model: ServedModel,
        inputs: list[Any],
        parameters: dict,
    ) -> EngineAnswer:
        with self._at_engine(key):
            return await self._alone(client, model, inputs, parameters)

    @contextlib.contextmanager
    def _at_engine(self, key: tuple[Any, ...]) -> Iterator[None]:
        """A call of this kind is at the engine while the block runs."""
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
        for part in _parts(group.waiting, group.cap):
            call = asyncio.ensure_future(self._call(group, part))
            self._calls.add(call)  # held until done: the loop keeps only weak references
            call.add_done_callback(self._calls.discard)

    async def _call(self, group: _Group, part: list[_Waiting]) -> None:
        with self._at_engine(group.key):
            await self._join(group, part)

    async def _join(self, group: _Group, part: list[_Waiting]) -> None:
        if len(part) == 1:
            await self._answer(group, part[0])
            return
        inputs = [x for w in part for x in w.inputs]
        try:
            joined = await self._alone(
                group.client, group.model, inputs, group.parameters, len(part)
            )
            answers = _split(joined, [len(w.inputs) for w in part])
        except (RequestError, _Unsplittable) as e:
            if isinstance(e, RequestError) and e.status >= 500:
                _fail(part, e)  # the engine's trouble (full, failing), not one request's
                return
            # one of them was refused (or the answer has no row per input): each alone,
            # so that only the one at fault hears of it
            await asyncio.gather(*(self._answer(group, w) for w in part))
            return
        except BaseException as e:  # the engine's failure is each request's
            _fail(part, e)
            if not isinstance(e, Exception):
                raise
            return
        for w, answer in zip(part, answers, strict=True):
            _settle(w, answer=answer)

    async def _answer(self, group: _Group, waiting: _Waiting) -> None:
        try:
            answer = await self._alone(group.client, group.model, waiting.inputs, group.parameters)
        except BaseException as e:  # handed to the request that waits for it
            _settle(waiting, exception=e)
            if not isinstance(e, Exception):
                raise
            return
        _settle(waiting, answer=answer)

    async def _alone(
        self,
        client: EngineClient,
        model: ServedModel,
        inputs: list[Any],
        parameters: dict,
        requests: int = 1,
    ) -> EngineAnswer:
        if self._on_call is not None:
            self._on_call(model.name, requests)
        return await client.predict(model.worker_name, inputs, parameters)


class _Unsplittable(Exception):
    """A joined answer without one row per input."""


def _parts(waiting: list[_Waiting], cap: int) -> list[list[_Waiting]]:
    """`waiting` in arrival order, in parts of at most `cap` inputs (a request over the
    cap on its own)."""
    parts: list[list[_Waiting]] = []
    size = cap
    for w in waiting:
        if size + len(w.inputs) > cap:
            parts.append([])
            size = 0
        parts[-1].append(w)
        size += len(w.inputs)
    return parts


def _split(answer: EngineAnswer, sizes: list[int]) -> list[EngineAnswer]:
    rows = answer.value
    if not isinstance(rows, (list, np.ndarray)) or len(rows) != sum(sizes):
        raise _Unsplittable
    answers, start = [], 0
    for n in sizes:
        part = rows[start : start + n]
        start += n
        answers.append(EngineAnswer(value=part))
    return answers


def _fail(part: list[_Waiting], exception: BaseException) -> None:
    for w in part:
        _settle(w, exception=exception)


def _settle(
    waiting: _Waiting, answer: EngineAnswer | None = None, exception: BaseException | None = None
) -> None:
    # a request cancelled meanwhile (its deadline, its client gone) takes nothing
    if waiting.answer.done():
        return
    if isinstance(exception, asyncio.CancelledError):
        waiting.answer.cancel()
    elif exception is not None:
        waiting.answer.set_exception(exception)
    else:
        waiting.answer.set_result(answer)  # type: ignore[arg-type]
