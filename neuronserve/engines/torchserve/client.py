"""The front's client of TorchServe: native requests (`{"inputs", "parameters"}`) as
JSON to the model's /predictions URL, the model named in a header (each worker holds every
model of the deployment), the answer's bytes kept as they came so a route that passes
them on never parses them; readiness from the management API, worker by worker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from ...serve.front.clients import (
    PLAIN,
    PROBE_TIMEOUT,
    EngineAnswer,
    EngineClient,
    EngineUnavailable,
    WorkerCounts,
    WorkerDied,
    engine_error,
    metrics_text,
    once_more,
)
from ...worker import MODEL_HEADER

if TYPE_CHECKING:
    from ...serve.front.model import ServedModel

# How TorchServe says the worker that held a request died with it: "Worker died." (500,
# or 507 when the worker was SIGKILLed: WorkerThread sends its exit code 137 as
# INSUFFICIENT_STORAGE). It never hands a dead worker another job.
_DIED = (b"Worker died",)


@dataclass(frozen=True)
class TorchServeUrls:
    predict: str  # the model's /predictions URL
    model: str  # the model's management URL (its workers)
    metrics: str
    # the Authorization headers carrying TorchServe's keys (token authorization)
    inference_auth: dict[str, str] = field(default_factory=dict)
    management_auth: dict[str, str] = field(default_factory=dict)


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
            **PLAIN,
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
            if status in (500, 507) and any(m in data for m in _DIED):
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
                self._model_url, headers=self._management_auth, timeout=PROBE_TIMEOUT
            ) as r:
                entries = await r.json() if r.status == 200 else []
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
            entries = []
        return WorkerCounts(self._counts(entries)[0], self._workers)

    async def metrics(self) -> str:
        return await metrics_text(self._session, self._metrics_url)

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
