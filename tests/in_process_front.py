"""The front in this process (Starlette's test client on its ASGI app), in front of an
engine in this process: each model's Runner answers what a worker would. For tests whose
point is the front's HTTP handling; what needs a real engine is in tests/servers."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from starlette.testclient import TestClient

from neuronserve.serve.front.app import build_app
from neuronserve.serve.front.clients import EngineAnswer, EngineClient, WorkerCounts
from neuronserve.serve.front.config import FrontConfig
from neuronserve.serve.front.model import ServedModel
from neuronserve.serve.front.serving import Serving
from neuronserve.spec import load_spec
from neuronserve.tasks import RequestError


class InProcessEngine(EngineClient):
    """An engine whose workers are the Runners here: a request goes to its model's
    Runner as one batch, as TorchServe's handler would send it."""

    kind = "in-process"

    def __init__(self, runners: dict[str, Any]):
        self.runners = runners
        self.counts = WorkerCounts(2, 2)
        # while set and not released, requests wait (each test-client request runs on a
        # loop of its own: a threading event, polled, works across them)
        self.hold: threading.Event | None = None
        self.calls = 0

    async def predict(self, model: str, inputs: Any, parameters: dict[str, Any]) -> EngineAnswer:
        self.calls += 1
        while self.hold is not None and not self.hold.is_set():
            await asyncio.sleep(0.01)
        body = {"inputs": inputs, "parameters": parameters}
        [answer] = self.runners[model].responses_for_bodies([(body, None)])
        if isinstance(answer, RequestError):
            raise answer
        return EngineAnswer(value=answer)

    async def invoke(self, model: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        [answer] = self.runners[model].responses_for_bodies([(body, content_type)])
        if isinstance(answer, RequestError):
            return answer.status, b'{"code": %d}' % answer.status
        return 200, EngineAnswer(value=answer).raw

    async def health(self) -> WorkerCounts:
        return self.counts

    async def metrics(self) -> str:
        return "# the engine's\n"

    async def close(self) -> None:
        pass

    def add(self, model: ServedModel) -> None:
        pass

    def forget(self, worker_name: str) -> None:
        pass

    def join_limit(self, worker_name: str) -> int:
        # joined as Triton's are: up to the largest compiled batch
        return int(self.runners[worker_name].manifest.grid.max_batch)


def served(runner, max_text_chars: int | None = None) -> ServedModel:
    m = runner.manifest
    return ServedModel(
        name=m.name,
        manifest=m,
        engine="in-process",
        truncation=runner.truncation,
        max_text_chars=max_text_chars,
        tokenizer=ServedModel.tokenizer_of(m, runner.artifact_dir),
    )


def front(tmp_path, runners: dict, **fields) -> tuple[TestClient, InProcessEngine, Serving]:
    config = FrontConfig.from_spec(load_spec(None, {"front_run_dir": tmp_path, **fields}))
    serving = Serving(config)
    engine = InProcessEngine(runners)
    chars = fields.get("max_text_chars")
    serving.attach({name: served(r, chars) for name, r in runners.items()}, engine)
    return TestClient(build_app(serving)), engine, serving
