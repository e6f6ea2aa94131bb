"""The front's client of Triton: a native request parsed with the model's task, its texts
sent as KServe v2 binary tensors (TEXT, and TEXT_PAIR), at most the largest compiled
batch per call, over the front's own aiohttp pool (kserve.py), and the task's JSON
built from the output rows; readiness from Triton's model readiness and the live stubs
(Triton says READY while a dead stub is still handed batches)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
import orjson

from ...serve.front.clients import (
    PLAIN,
    PROBE_TIMEOUT,
    EngineAnswer,
    EngineClient,
    EngineUnavailable,
    WorkerCounts,
    WorkerDied,
    metrics_text,
    once_more,
)
from ...tasks import RequestError, Task, get_task
from ...tasks.base import RequestLimits, bytes_element
from ...worker import MODEL_PARAMETER
from . import kserve

if TYPE_CHECKING:
    from ...serve.front.model import ServedModel
    from ...tasks import TaskRequest

# How Triton's Python backend says the instance that held a request died with it: "Stub
# process '<instance>' is not healthy." (500) for a batch handed to a dead stub, until
# the healer replaces it
_DIED = ("is not healthy",)
# Triton names the dead instance: "Stub process 'cores1_0' is not healthy."
_INSTANCE = re.compile(r"Stub process '([^']+)'")
# what Triton answers while a whole model reloads (a repository the healer cannot heal
# an instance at a time): the front says 503 and Retry-After, not the engine's 500/404
_RELOADING = ("Request for unknown model", "is not ready")
# how long the front waits for the healer to take a dead instance out of rotation
SETTLE_S = 5.0
# how long /health waits for Triton's word on the model before it goes by the stubs
_READY_WAIT_S = 0.5


@dataclass(frozen=True)
class TritonUrls:
    http: str
    metrics: str
    # the header carrying the key inference is behind (TritonInstance.headers)
    auth: dict[str, str] = field(default_factory=dict)


class TritonClient(EngineClient):
    kind = "triton"

    def __init__(  # noqa: PLR0913 - the engine's facts, each one of its own
        self,
        name: str,
        models: dict[str, ServedModel],
        urls: TritonUrls,
        instances: int,
        connections: int,
        alive: Callable[[], int],
        out_of_rotation: Callable[[str], bool],
    ):
        """`name`: the Triton model holding `models`; `alive`: its live instances (stub
        processes) now; `out_of_rotation(instance)`: whether Triton no longer hands that
        instance batches from a dead stub (TritonInstance.out_of_rotation)."""
        # inference as KServe v2 binary tensors on a pool of its own (kserve.py); the
        # front's deadline bounds a request, not this session
        self._infer_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        self._infer_url = f"{urls.http}/v2/models/{name}/infer"
        self._ready_url = f"{urls.http}/v2/models/{name}/ready"
        self._aux = aiohttp.ClientSession(timeout=PROBE_TIMEOUT)
        self._metrics_url = f"{urls.metrics}/metrics"
        self._name, self._instances, self._alive = name, instances, alive
        self._headers = {**PLAIN, **urls.auth}
        self._out_of_rotation = out_of_rotation
        self._models = {n: _TritonModel.of(m) for n, m in models.items()}

    async def predict(self, model: str, inputs: Any, parameters: dict[str, Any]) -> EngineAnswer:
        m = self._models[model]
        request = m.task.parse(inputs, parameters)
        # refused here, as the instances would: an over-long text is the sender's error
        # even while an instance is being replaced
        too_long = m.limits.check(request)
        if too_long is not None:
            raise too_long
        rows = await self._rows(model, request)
        return EngineAnswer(value=m.task.respond(rows, request, m.info))

    async def _rows(self, model: str, request: TaskRequest) -> Any:
        """The request's results (`Task.finish`) from Triton: the task's parameters go
        along as Triton request parameters, since the instances build per-text results
        with them (entities, answers, predictions), and so does the model's name."""
        m = self._models[model]
        # Triton's parameters are scalars: a list of names travels comma-joined
        params: dict[str, Any] = {
            k: ",".join(v) if isinstance(v, list) else v
            for k, v in request.parameters.items()
            if isinstance(v, (bool, int, str, list))
        }
        params[MODEL_PARAMETER] = model
        if request.truncate is not None:
            params["truncate"] = request.truncate
            params["truncation_direction"] = request.truncation_direction
        # TEXT_PAIR covers a whole call, so pairs and single texts go in calls of their
        # own; Triton refuses a batch over max_batch_size, and pieces sent at once spread
        # over the instances
        texts, step = request.texts, m.max_batch
        pieces: list[list[int]] = []
        for pairs in (False, True):
            idx = [i for i, t in enumerate(texts) if isinstance(t, tuple) == pairs]
            pieces += [idx[k : k + step] for k in range(0, len(idx), step)]
        output = m.task.output_for(request.parameters) or m.output
        calls = [self._infer(m, [texts[i] for i in piece], params, output) for piece in pieces]
        # one piece (most requests) awaited as it is: gather would make it a task
        parts = (
            [await calls[0]]
            if len(calls) == 1
            else await asyncio.gather(*calls, return_exceptions=True)
        )
        results: list[Any] = [None] * len(texts)
        for piece, part in zip(pieces, parts, strict=True):
            if isinstance(part, BaseException):
                raise part
            for i, result in zip(piece, m.task.results_from(part, m.info), strict=True):
                results[i] = result
        # rows (a vector per text) stack; per-token results (a matrix per text) cannot
        rows = isinstance(results[0], np.ndarray) and results[0].ndim == 1
        return np.stack(results) if rows else results

    async def _infer(
        self, m: _TritonModel, texts: list, params: dict[str, Any], output: str
    ) -> np.ndarray:
        columns = {
            m.task.input_tensor: [bytes_element(t[0] if isinstance(t, tuple) else t) for t in texts]
        }
        if isinstance(texts[0], tuple):
            columns["TEXT_PAIR"] = [bytes_element(t[1]) for t in texts]
        body, headers = kserve.infer_body(columns, output, params or None)
        headers = {**self._headers, **headers}

        async def send() -> np.ndarray:
            try:
                async with self._infer_session.post(
                    self._infer_url, data=body, headers=headers
                ) as resp:
                    raw = await resp.read()
                    if resp.status == 200:
                        return kserve.output_array(
                            raw, resp.headers.get(kserve.HEADER_LENGTH), output
                        )
            except (aiohttp.ClientError, OSError) as e:
                raise EngineUnavailable(f"Triton did not answer: {e}") from None
            message = kserve.error_message(raw)
            if any(d in message for d in _DIED):
                named = _INSTANCE.search(message)
                raise WorkerDied(
                    f"Triton's instance died: {message}", named.group(1) if named else ""
                )
            if any(r in message for r in _RELOADING):
                raise EngineUnavailable(f"Triton is reloading the model: {message}")
            raise RequestError.from_engine(message, resp.status)

        return await once_more(send, f"a request to {self._name}", self._settle)

    async def _settle(self, died: WorkerDied) -> None:
        """Wait (at most SETTLE_S) until the healer has the dead instance out of rotation,
        so that the request sent again goes to a live one."""
        if not died.worker:
            return
        check = self._out_of_rotation
        deadline = asyncio.get_running_loop().time() + SETTLE_S
        while asyncio.get_running_loop().time() < deadline:
            out: bool = await asyncio.to_thread(check, died.worker)
            if out:
                return
            await asyncio.sleep(0.02)

    async def invoke(self, model: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        try:
            inputs, parameters = self._models[model].task.decode(body, content_type)
            answer = await self.predict(model, inputs, parameters)
        except RequestError as e:
            return e.status, orjson.dumps({"code": e.status, "error": e.message})
        return 200, answer.raw

    async def health(self) -> WorkerCounts:
        alive = await asyncio.to_thread(self._alive)
        try:
            # Triton holds this answer while it updates the model's instances (the
            # healer's loads, seconds): the live stubs say it is serving meanwhile
            ready = await asyncio.wait_for(self._ready(), _READY_WAIT_S)
        except asyncio.TimeoutError:
            ready = alive > 0
        except (aiohttp.ClientError, OSError):
            ready = False
        # Triton says READY while a dead stub is still handed batches: the live stubs
        # are the truth (the healer replaces one that is missing)
        return WorkerCounts(alive if ready else 0, self._instances)

    async def _ready(self) -> bool:
        """KServe v2 model readiness: 200 when ready."""
        async with self._aux.get(self._ready_url, headers=self._headers) as resp:
            await resp.read()
            return resp.status == 200

    async def metrics(self) -> str:
        return await metrics_text(self._aux, self._metrics_url)

    def add(self, model: ServedModel) -> None:
        self._models[model.worker_name] = _TritonModel.of(model)

    def forget(self, worker_name: str) -> None:
        self._models.pop(worker_name, None)

    def join_limit(self, worker_name: str) -> int:
        # Triton's batcher counts rows: a joined call is a batch of its own, and its
        # instances each take one while it waits
        m = self._models.get(worker_name)
        return m.max_batch if m is not None else 1

    async def close(self) -> None:
        await self._infer_session.close()
        await self._aux.close()


@dataclass(frozen=True)
class _TritonModel:
    """What the Triton client needs of a served model: its task, limits, answer facts,
    the largest batch one call may hold and the output tensor holding its rows."""

    task: Task
    limits: RequestLimits
    info: dict[str, Any]
    max_batch: int
    output: str

    @classmethod
    def of(cls, model: ServedModel) -> _TritonModel:
        manifest = model.manifest
        task = get_task(manifest.task)
        return cls(
            task=task,
            limits=RequestLimits(chars=model.max_text_chars),
            info=manifest.task_info(),
            max_batch=manifest.grid.max_batch,
            # the first tensor of a task holds the model's raw output rows
            output=task.output_tensors(manifest.output_dim, manifest.labels)[0].name,
        )
