"""The front in this process (Starlette's test client on its ASGI app), in front of
workers in this process: each model's Runner answers what a worker would, its results
read back through a worker's answer frame. For tests whose point is the front's HTTP
handling; what needs real workers is in tests/servers."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

from helpers import through_the_wire
from starlette.testclient import TestClient

from neuronserve.serve.front.app import build_app
from neuronserve.serve.front.config import FrontConfig
from neuronserve.serve.front.serving import Serving
from neuronserve.served import ServedModel
from neuronserve.spec import load_spec
from neuronserve.tasks import RequestError, TaskRequest
from neuronserve.workers.answers import WorkerClient, WorkerCounts


class InProcessWorkers(WorkerClient):
    """Workers that are the Runners here: a request goes to its model's Runner as one
    batch, as a worker runs it."""

    kind = "in-process"

    def __init__(self, runners: dict[str, Any]):
        self.runners = runners
        self.counts = WorkerCounts(2, 2)
        # while set and not released, requests wait (each test-client request runs on a
        # loop of its own: a threading event, polled, works across them)
        self.hold: threading.Event | None = None
        self.calls = 0

    async def run(self, model: ServedModel, request: TaskRequest) -> Any:
        self.calls += 1
        while self.hold is not None and not self.hold.is_set():
            await asyncio.sleep(0.01)
        sent = dataclasses.replace(request)  # the worker's own copy, as over a wire
        [result] = self.runners[model.worker_name].outputs([sent])
        if isinstance(result, RequestError):
            raise result
        request.tokens = sent.tokens  # what a worker's answer carries back
        return through_the_wire(result)  # read-only arrays over the frame, as they arrive

    async def health(self) -> WorkerCounts:
        return self.counts

    async def metrics(self) -> str:
        return "# the workers'\n"

    async def close(self) -> None:
        pass


def served(
    runner,
    max_text_chars: int | None = None,
    max_request_chars: int | None = None,
    max_chunks: int | None = None,
) -> ServedModel:
    m = runner.manifest
    return ServedModel(
        name=m.name,
        manifest=m,
        truncation=runner.truncation,
        max_text_chars=max_text_chars,
        tokenizer=_tokenizer(runner),
        max_request_chars=max_request_chars,
        calibration=ServedModel.calibration_of(m, runner.artifact_dir),
        max_chunks=max_chunks,
    )


# Runner id -> (the Runner, kept so that its id is never another's, its tokenizer)
_TOKENIZERS: dict[int, tuple[Any, Any]] = {}


def _tokenizer(runner) -> Any:
    """The served model's tokenizer, made once per Runner: a test makes many fronts of
    the same models, and a tokenizer takes tens of milliseconds to read."""
    if id(runner) not in _TOKENIZERS:
        tok = ServedModel.tokenizer_of(runner.manifest, runner.artifact_dir)
        _TOKENIZERS[id(runner)] = (runner, tok)
    return _TOKENIZERS[id(runner)][1]


def config_of(spec, sagemaker: bool = False) -> FrontConfig:
    """The front's settings of a whole spec, as `serve front` takes them."""
    return FrontConfig.of(spec.front, spec.limits, spec.multi_model, sagemaker)


def front(tmp_path, runners: dict, **fields) -> tuple[TestClient, InProcessWorkers, Serving]:
    spec = load_spec(None, {"front_run_dir": tmp_path, **fields})
    serving = Serving(config_of(spec))
    engine = InProcessWorkers(runners)
    chars, total = fields.get("max_text_chars"), spec.limits.max_body_bytes
    chunks = spec.limits.max_chunks_per_request
    serving.attach({name: served(r, chars, total, chunks) for name, r in runners.items()}, engine)
    return TestClient(build_app(serving)), engine, serving
