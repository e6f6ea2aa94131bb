"""What the front's routes share: the engine's client once the engine is ready, the
served model's facts (read once from its manifest), the limits, and a short-lived
health answer so probes do not each call the engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...tasks import RequestError
from ...tasks.base import Text
from .clients import EngineAnswer, EngineClient, WorkerCounts
from .config import FrontConfig
from .model import ServedModel

# how long one health answer from the engine is reused
HEALTH_TTL_S = 1.0
# texts with more characters than this in all are tokenized off the event loop
_INLINE_CHARS = 4096


class NotReady(Exception):
    """The engine is still loading (or failed): answered 503 with Retry-After."""


class Serving:
    def __init__(self, config: FrontConfig):
        self.config = config
        self.client: EngineClient | None = None
        self.model: ServedModel | None = None
        self.info: dict[str, Any] = {}
        self.exit_code = 0
        self._health: tuple[float, WorkerCounts] | None = None

    def attach(self, model: ServedModel, client: EngineClient) -> None:
        self.model, self.client = model, client
        self.info = model.info(self.config)

    def ready(self) -> tuple[ServedModel, EngineClient]:
        if self.model is None or self.client is None:
            raise NotReady
        return self.model, self.client

    def require_task(self, route: str, *tasks: str) -> ServedModel:
        model, _ = self.ready()
        if model.task not in tasks:
            raise RequestError(
                f"{route} needs a {' or '.join(tasks)} model; {model.name} is {model.task}",
                status=404,
            )
        return model

    async def predict(self, inputs: list[Any], parameters: dict[str, Any]) -> EngineAnswer:
        """The engine's answer for a list of inputs, within the client batch limit (or in
        pieces of it, when the spec allows)."""
        _, client = self.ready()
        limit = self.config.max_client_batch
        if len(inputs) <= limit:
            return await client.predict(inputs, parameters)
        if not self.config.split_client_batches:
            raise self._too_many(len(inputs))
        parts = await asyncio.gather(
            *(
                client.predict(inputs[i : i + limit], parameters)
                for i in range(0, len(inputs), limit)
            )
        )
        return EngineAnswer(value=[row for part in parts for row in part.value])

    async def predict_whole(
        self, inputs: Any, count: int, parameters: dict[str, Any]
    ) -> EngineAnswer:
        """The engine's answer for one request of `count` texts that cannot be split
        (a rerank's documents are ranked against each other)."""
        _, client = self.ready()
        if count > self.config.max_client_batch:
            raise self._too_many(count)
        return await client.predict(inputs, parameters)

    def _too_many(self, count: int) -> RequestError:
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

    async def count_tokens(self, texts: Sequence[Text], truncate: bool | None) -> int:
        """Tokens the model reads for `texts` (what OpenAI's usage reports)."""
        model, _ = self.ready()
        cut = model.truncation if truncate is None else truncate
        tokenizer = model.tokenizer
        if tokenizer is None:
            return 0  # an image model reads no tokens

        def count() -> int:
            encoded = tokenizer.encode(texts, cut)
            return sum(min(len(e.ids), tokenizer.max_length) for e in encoded)

        return await off_loop(count, sum(len(t) for t in texts if isinstance(t, str)))


async def off_loop(fn: Callable[[], Any], chars: int) -> Any:
    """`fn()`, in a worker thread when its input is large enough to stall other requests."""
    return fn() if chars <= _INLINE_CHARS else await asyncio.to_thread(fn)


def normalized(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)
