"""The front's clients of the engines behind it, each behind one small interface that
every engine implements fully (`EngineClient`): answer a native request, pass a SageMaker
body through, say how many workers are ready, hand over its metrics. An engine makes its
own (`serve.engine.Engine.client`).

A native request is what TorchServe's handler takes (`{"inputs", "parameters"}`) and
its answer the task's JSON. TorchServe speaks it already, so its client forwards bytes
and never parses an answer a route passes on as it is. Triton speaks tensors, so its
client parses the request with the task, sends TEXT (and TEXT_PAIR) rows, at most the
largest compiled batch per call, and builds the same JSON from the output rows.

Clients are pooled and asynchronous, on aiohttp: TorchServe's JSON, and Triton's KServe
v2 binary tensors and readiness (kserve.py). httpx was measured here at 1.7 ms of CPU per
request against aiohttp's 0.11 ms, which alone would have cost the front its target.
"""

from __future__ import annotations

import asyncio
import logging
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import numpy as np
import orjson

from ...tasks import RequestError, Task, get_task
from ...tasks.base import RequestLimits, bytes_element
from ...worker import MODEL_HEADER, MODEL_PARAMETER
from . import kserve
from .model import ServedModel

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ...tasks import TaskRequest

log = logging.getLogger("neuronserve.front")
T = TypeVar("T")
_UNSET: Any = object()
# health and metrics calls: an engine that takes longer than this is not healthy
_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=5)


# aiohttp offers gzip by default, and Triton then compresses every answer for a client on
# the same host, costing CPU on both sides of a loopback connection
_PLAIN = {"Accept-Encoding": "identity"}


# How each engine says the worker that held a request died with it: TorchServe answers
# "Worker died." (500, or 507 when the worker was SIGKILLed: WorkerThread sends its exit
# code 137 as INSUFFICIENT_STORAGE); Triton's Python backend "Stub process '<instance>'
# is not healthy." (500) for a batch handed to a dead stub, until the healer replaces it.
_TORCHSERVE_DIED = (b"Worker died",)
_TRITON_DIED = ("is not healthy",)
# what Triton answers while a whole model reloads (a repository the healer cannot heal
# an instance at a time): the front says 503 and Retry-After, not the engine's 500/404
_TRITON_RELOADING = ("Request for unknown model", "is not ready")


class EngineUnavailable(RuntimeError):
    """The engine did not answer at all (stopped, restarting, refused the connection)."""


class WorkerDied(EngineUnavailable):
    """The worker (instance) that held the request died with it: another may answer it."""

    def __init__(self, message: str, worker: str = ""):
        super().__init__(message)
        self.worker = worker  # the engine's name for it, where it says


# Triton names the dead instance: "Stub process 'cores1_0' is not healthy."
_TRITON_INSTANCE = re.compile(r"Stub process '([^']+)'")
# how long the front waits for the healer to take a dead instance out of rotation
SETTLE_S = 5.0
# how long /health waits for Triton's word on the model before it goes by the stubs
_READY_WAIT_S = 0.5


async def once_more(
    call: Callable[[], Awaitable[T]],
    what: str,
    settle: Callable[[WorkerDied], Awaitable[None]] | None = None,
) -> T:
    """`call()`, and once more if its worker died under it, to another worker: TorchServe
    never hands a dead worker a job; Triton keeps handing a dead instance batches until
    the healer takes it out of rotation, which `settle` waits for. So a client sees no
    failure for a killed worker unless every worker is gone (then 503, Retry-After)."""
    try:
        return await call()
    except WorkerDied as e:
        log.warning("%s: %s; sent again", what, e)
        if settle is not None:
            await settle(e)
        return await call()


class EngineAnswer:
    """An engine's JSON answer to one native request, kept in the form it came in (bytes
    from TorchServe, values from Triton) and converted only if a route needs the other."""

    __slots__ = ("_raw", "_value")

    def __init__(self, raw: bytes | None = None, value: Any = _UNSET):
        self._raw, self._value = raw, value

    @property
    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = orjson.dumps(self._value, option=orjson.OPT_SERIALIZE_NUMPY)
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


@dataclass(frozen=True)
class TorchServeUrls:
    predict: str  # the model's /predictions URL
    model: str  # the model's management URL (its workers)
    metrics: str
    # the Authorization headers carrying TorchServe's keys (token authorization)
    inference_auth: dict[str, str] = field(default_factory=dict)
    management_auth: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TritonUrls:
    http: str
    metrics: str
    # the header carrying the key inference is behind (TritonInstance.headers)
    auth: dict[str, str] = field(default_factory=dict)


class EngineClient(ABC):
    kind: str

    @abstractmethod
    async def predict(self, model: str, inputs: Any, parameters: dict[str, Any]) -> EngineAnswer:
        """Model `model`'s answer to `{"inputs": inputs, "parameters": parameters}`;
        raises RequestError with the engine's status for a request it refused."""

    @abstractmethod
    async def invoke(self, model: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        """(status, JSON body) for a request body to `model` as SageMaker's /invocations
        takes it."""

    @abstractmethod
    async def health(self) -> WorkerCounts:
        """How many workers (instances) are ready, of how many the plan has."""

    @abstractmethod
    async def metrics(self) -> str:
        """The engine's own Prometheus text."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    def add(self, model: ServedModel) -> None:
        """A model the workers now hold (multi-model), addressed by its worker name."""

    @abstractmethod
    def forget(self, worker_name: str) -> None:
        """A model the workers no longer hold."""

    @abstractmethod
    def join_limit(self, worker_name: str) -> int:
        """The most texts the front may join into one call of this model from requests
        that arrive together (coalescing.py); 1: send each request as it came."""


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


class TorchServeClient(EngineClient):
    kind = "torchserve"

    def __init__(
        self,
        urls: TorchServeUrls,
        workers: int,
        connections: int,
        counts: Callable[[list[dict]], tuple[int, int, list[str]]],
    ):
        """`counts`: (ready, expected, statuses) of the management API's answer about
        the model (TorchServe's own rule, torchserve.worker_counts_of)."""
        # No total timeout: the front's deadline cancels a request that runs too long.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, limit_per_host=connections),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        self._predict_url, self._model_url = urls.predict, urls.model
        self._metrics_url = f"{urls.metrics}/metrics"
        self._workers, self._counts = workers, counts
        self._inference_auth, self._management_auth = urls.inference_auth, urls.management_auth

    async def _post(self, model: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        # the worker holds every model of the deployment: the header says which one
        headers = {
            **_PLAIN,
            **self._inference_auth,
            "Content-Type": content_type,
            MODEL_HEADER: model,
        }

        async def send() -> tuple[int, bytes]:
            try:
                async with self._session.post(self._predict_url, data=body, headers=headers) as r:
                    status, data = r.status, await r.read()
            except (aiohttp.ClientError, OSError) as e:
                raise EngineUnavailable(f"TorchServe did not answer: {e}") from None
            if status in (500, 507) and any(m in data for m in _TORCHSERVE_DIED):
                raise WorkerDied(f"TorchServe's worker died: {data[:200]!r}")
            return status, data

        return await once_more(send, f"a request to {model}")

    async def predict(self, model: str, inputs: Any, parameters: dict[str, Any]) -> EngineAnswer:
        request = {"inputs": inputs, "parameters": parameters} if parameters else {"inputs": inputs}
        status, data = await self._post(model, orjson.dumps(request), "application/json")
        if status != 200:
            raise engine_error(status, data)
        return EngineAnswer(raw=data)

    async def invoke(self, model: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        return await self._post(model, body, content_type)

    async def health(self) -> WorkerCounts:
        try:
            async with self._session.get(
                self._model_url, headers=self._management_auth, timeout=_PROBE_TIMEOUT
            ) as r:
                entries = await r.json() if r.status == 200 else []
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
            entries = []
        return WorkerCounts(self._counts(entries)[0], self._workers)

    async def metrics(self) -> str:
        return await _text(self._session, self._metrics_url)

    # the header names the model: nothing to keep per model
    def add(self, model: ServedModel) -> None:
        pass

    def forget(self, worker_name: str) -> None:
        pass

    def join_limit(self, worker_name: str) -> int:
        # TorchServe's batchSize counts requests, and it hands the first free worker
        # everything queued up to it: joined calls left the other workers idle (8-token
        # texts, 32 clients, two workers: 795 req/s joined in eights, 1,186 as they came)
        return 1

    async def close(self) -> None:
        await self._session.close()


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
        self._aux = aiohttp.ClientSession(timeout=_PROBE_TIMEOUT)
        self._metrics_url = f"{urls.metrics}/metrics"
        self._name, self._instances, self._alive = name, instances, alive
        self._headers = {**_PLAIN, **urls.auth}
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
            if any(d in message for d in _TRITON_DIED):
                named = _TRITON_INSTANCE.search(message)
                raise WorkerDied(
                    f"Triton's instance died: {message}", named.group(1) if named else ""
                )
            if any(r in message for r in _TRITON_RELOADING):
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
        return await _text(self._aux, self._metrics_url)

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


async def _text(session: aiohttp.ClientSession, url: str) -> str:
    try:
        async with session.get(url, timeout=_PROBE_TIMEOUT) as r:
            return await r.text()
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        return f"# the engine's metrics at {url} did not answer: {type(e).__name__}\n"
