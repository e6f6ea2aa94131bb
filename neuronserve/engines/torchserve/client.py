"""The front's client of TorchServe: a request's texts as the handler's JSON
(`{"inputs", "parameters"}`) to the model's /predictions URL, the model named in a header
(each worker holds every model of the deployment), its results back as named tensors
(neuronserve.tensors: the front answers, as for every engine); readiness from the
management API, worker by worker."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import psutil

from ... import tensors
from ...tracing import STAGES_HEADER, TRACE_HEADER, TRACING, Stage, parse_stages
from ...worker import ANSWER_HEADER, ANSWER_TENSORS, MODEL_HEADER
from ..client import (
    PLAIN,
    PROBE_TIMEOUT,
    EngineClient,
    EngineUnavailable,
    WorkerCounts,
    WorkerDied,
    engine_error,
    metrics_text,
    once_more,
)

if TYPE_CHECKING:
    from ...served import ServedModel
    from ...tasks import TaskRequest

# How TorchServe says the worker that held a request died with it: "Worker died." (500,
# or 507 when the worker was SIGKILLed: WorkerThread sends its exit code 137 as
# INSUFFICIENT_STORAGE). It never hands a dead worker another job.
log = logging.getLogger("neuronserve.front")

_DIED = (b"Worker died",)
# the response headers an answer is read with: its tensors' header length, and a traced
# request's worker stages
_KEPT_HEADERS = (tensors.HEADER_LENGTH, STAGES_HEADER)
# (status, body, the kept response headers)
Answer = tuple[int, bytes, dict[str, str] | None]
# how long a request may wait unanswered after a worker died before it is sent again
HEDGE_AFTER_DEATH_S = 5.0


@dataclass(frozen=True)
class TorchServeUrls:
    predict: str  # the model's /predictions URL
    model: str  # the model's management URL (its workers)
    metrics: str
    # the Authorization headers carrying TorchServe's keys (token authorization)
    inference_auth: dict[str, str] = field(default_factory=dict)
    management_auth: dict[str, str] = field(default_factory=dict)


class TorchServeClient(EngineClient):
    # TorchServe's batchSize counts requests (its frontend's aggregator)
    batches = "requests"

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
        # when a worker was last seen to die (a request it held answered "Worker died")
        self._died_at = float("-inf")
        self._inference_auth, self._management_auth = urls.inference_auth, urls.management_auth

    async def run(self, model: ServedModel, request: TaskRequest) -> Any:
        """The request as TorchServe's handler takes it (`{"inputs", "parameters"}`, the
        model named in a header), its results asked for as named tensors."""
        task = model.handler
        params = dict(request.parameters)
        if request.truncate is not None:
            params["truncate"] = request.truncate
            params["truncation_direction"] = request.truncation_direction
        body = orjson.dumps({"inputs": task.inputs_of(request.texts), "parameters": params})
        # the worker holds every model of the deployment: the header says which one
        headers = {
            **PLAIN,
            **self._inference_auth,
            "Content-Type": "application/json",
            MODEL_HEADER: model.worker_name,
            ANSWER_HEADER: ANSWER_TENSORS,
        }
        if TRACING.recording():  # the worker's stages come back in a response header
            headers[TRACE_HEADER] = "1"
        what = f"a request to {model.worker_name}"
        status, data, kept = await self._send(body, headers, what)
        if status != 200:
            raise engine_error(status, data)
        kept = kept or {}
        if STAGES_HEADER in kept:
            TRACING.stages(_stages(kept[STAGES_HEADER]))
        head = kept.get(tensors.HEADER_LENGTH)
        codec = tensors.of(task.name)
        m = model.manifest
        name = codec.output_for(params) or tensors.first_output(task.name, m.output_dim, m.labels)
        found = tensors.unpack_all(data, head, (name, tensors.TOKENS))
        if name not in found:
            raise ValueError(f"the worker's answer holds no tensor {name!r}")
        request.tokens = tensors.token_counts(found.get(tensors.TOKENS))
        return codec.decode(found[name], model.task_info)

    async def _send(self, body: bytes, headers: dict[str, str], what: str) -> Answer:
        """The answer to one request, sent once more if its worker died (once_more); and
        once more still, the first answer taken, if a worker died after it was sent and
        it is unanswered HEDGE_AFTER_DEATH_S later: TorchServe may keep a job it had
        given a worker as that worker died, unanswered until its response timeout. A
        death is seen from an answer ("Worker died") or, when no request got one (the
        dead worker held only this one), from the workers themselves."""
        sent, since_boot = time.monotonic(), time.clock_gettime(time.CLOCK_BOOTTIME)
        first = asyncio.ensure_future(once_more(lambda: self._post(body, headers), what))
        tasks = [first]
        try:
            while True:
                done, _ = await asyncio.wait({first}, timeout=HEDGE_AFTER_DEATH_S)
                if done:
                    return first.result()
                if self._died_at > sent or await self._worker_lost_since(since_boot):
                    break
            log.warning("%s: unanswered since a worker died; sent again", what)
            second = asyncio.ensure_future(self._post(body, headers))
            tasks.append(second)
            done, _ = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
            if second in done and second.exception() is None:
                return second.result()
            return await first
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()

    async def _post(self, body: bytes, headers: dict[str, str]) -> Answer:
        try:
            async with self._session.post(self._predict_url, data=body, headers=headers) as r:
                status, data = r.status, await r.read()
                kept = {k: r.headers[k] for k in _KEPT_HEADERS if k in r.headers}
        except (aiohttp.ClientError, OSError) as e:
            raise EngineUnavailable(f"TorchServe did not answer: {e}") from None
        if status in (500, 507) and any(m in data for m in _DIED):
            self._died_at = time.monotonic()
            raise WorkerDied(f"TorchServe's worker died: {data[:200]!r}")
        return status, data, kept

    async def _worker_lost_since(self, since_boot: float) -> bool:
        """Whether a worker died since `since_boot` (seconds since the host booted): one
        is missing or not ready now, or one started after it (TorchServe replaced one
        that died). The workers are processes of this host (the front started their
        server); a process's start is counted from boot in clock ticks, so it is compared
        there, not against the wall clock (the boot's wall time is whole seconds)."""
        entries = await self._entries()
        ready, _, _ = self._counts(entries)
        if ready < self._workers:
            return True
        for entry in entries:
            for worker in entry.get("workers", []):
                try:
                    started = psutil.Process(int(worker.get("pid", 0))).create_time()
                    if started - psutil.boot_time() > since_boot:
                        return True
                except (ValueError, psutil.Error):
                    return True
        return False

    async def _entries(self) -> list[dict]:
        """The management API's answer about the model ([] when it gives none)."""
        try:
            async with self._session.get(
                self._model_url, headers=self._management_auth, timeout=PROBE_TIMEOUT
            ) as r:
                return await r.json() if r.status == 200 else []
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
            return []

    async def health(self) -> WorkerCounts:
        return WorkerCounts(self._counts(await self._entries())[0], self._workers)

    async def metrics(self) -> str:
        return await metrics_text(self._session, self._metrics_url)

    async def close(self) -> None:
        await self._session.close()


def _stages(header: str) -> list[Stage]:
    """The worker's stages from its response header (JSON)."""
    try:
        return parse_stages(orjson.loads(header), engine="torchserve")
    except orjson.JSONDecodeError:
        return []
