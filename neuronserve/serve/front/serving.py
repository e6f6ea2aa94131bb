"""What the front's routes share: the engine's client once the engine is ready, the
served model's facts (read once from its manifest), the limits, and a short-lived
health answer so probes do not each call the engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import __version__
from ...packaging.model import recorded_unless_given
from ...tasks import RequestError
from ...tasks.base import Text
from ...tokenization import TextTokenizer
from .config import FrontConfig
from .engines import EngineClient, Health, Prediction

if TYPE_CHECKING:
    from ...artifact import Manifest
    from ..engine import Engine

# how long one health answer from the engine is reused
HEALTH_TTL_S = 1.0
# texts with more characters than this in all are tokenized off the event loop
_INLINE_CHARS = 4096


class NotReady(Exception):
    """The engine is still loading (or failed): answered 503 with Retry-After."""


@dataclass(frozen=True)
class Model:
    """The served model as the routes need it, read once from the artifact."""

    name: str
    manifest: Manifest
    engine: str
    truncation: bool
    tokenizer: TextTokenizer | None  # None for an image model

    @classmethod
    def of(cls, engine: Engine) -> Model:
        m = engine.manifest
        return cls(
            name=engine.name,
            manifest=m,
            engine=engine.engine_name,
            truncation=recorded_unless_given(engine.spec.truncation, m.truncation),
            tokenizer=TextTokenizer(
                Path(engine.artifact) / m.tokenizer.file, m.tokenizer.max_length
            )
            if m.tokenizer
            else None,
        )

    @property
    def task(self) -> str:
        return self.manifest.task

    def info(self, config: FrontConfig) -> dict[str, Any]:
        m = self.manifest
        if m.labels:
            model_type: dict[str, Any] = {
                "classifier": {"id2label": {str(i): label for i, label in enumerate(m.labels)}}
            }
        else:
            model_type = {"embedding": {"pooling": m.pooling, "normalize": m.normalize}}
        return {
            "model_id": self.name,
            "task": m.task,
            "target": m.target,
            "precision": m.precision,
            "engine": self.engine,
            "model_type": model_type,
            "batch_sizes": m.batch_sizes,
            "sequence_lengths": m.sequence_lengths,
            "max_input_length": m.grid.max_seq,
            "max_client_batch_size": config.max_client_batch,
            "max_concurrent_requests": config.max_in_flight,
            "truncation": self.truncation,
            "versions": dict(m.versions),
            "version": __version__,
        }


class Serving:
    def __init__(self, config: FrontConfig):
        self.config = config
        self.client: EngineClient | None = None
        self.model: Model | None = None
        self.info: dict[str, Any] = {}
        self.exit_code = 0
        self._health: tuple[float, Health] | None = None

    def attach(self, model: Model, client: EngineClient) -> None:
        self.model, self.client = model, client
        self.info = model.info(self.config)

    def ready(self) -> tuple[Model, EngineClient]:
        if self.model is None or self.client is None:
            raise NotReady
        return self.model, self.client

    def require_task(self, route: str, *tasks: str) -> Model:
        model, _ = self.ready()
        if model.task not in tasks:
            raise RequestError(
                f"{route} needs a {' or '.join(tasks)} model; {model.name} is {model.task}",
                status=404,
            )
        return model

    async def predict(self, inputs: list[Any], parameters: dict[str, Any]) -> Prediction:
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
        return Prediction(value=[row for part in parts for row in part.value])

    async def predict_whole(
        self, inputs: Any, count: int, parameters: dict[str, Any]
    ) -> Prediction:
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

    async def health(self) -> Health:
        if self.client is None:
            return Health(0, 0)
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
