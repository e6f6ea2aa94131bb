"""The front joins requests that reach it together into one engine call (coalescing.py):
each request still gets its own rows, its own error, and a lone request is sent at once.
Here the first of each kind goes at once, and those that arrive while it is at the
engine are joined."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson
import pytest
from in_process_front import InProcessWorkers, front

from neuronserve.tasks import RequestError


class Recording(InProcessWorkers):
    """Remembers how many texts each call carried; a call takes a moment, as a real one."""

    def __init__(self, runners: dict[str, Any]):
        super().__init__(runners)
        self.sizes: list[int] = []

    async def run(self, model: Any, request: Any) -> Any:
        self.sizes.append(len(request.texts))
        await asyncio.sleep(0.005)
        return await super().run(model, request)


@pytest.fixture
def serving(tmp_path, tiny_runner):
    _, _, serving = front(tmp_path, {"tiny": tiny_runner})
    engine = Recording({"tiny": tiny_runner})
    serving.attach(serving.models, engine)
    return serving, engine, serving.models["tiny"]


def _together(serving, model, requests: list[tuple[list[str], dict]]) -> list[Any]:
    async def all_at_once() -> list[Any]:
        calls = [serving.predict(model, texts, params) for texts, params in requests]
        return await asyncio.gather(*calls, return_exceptions=True)

    return asyncio.run(all_at_once())


def _alone(tiny_runner, texts: list[str]) -> np.ndarray:
    [rows] = tiny_runner.responses_for_bodies([({"inputs": texts}, None)])
    return np.asarray(rows, dtype=np.float32)


def _counted(serving, what: str) -> float:
    return serving.metrics.registry.get_sample_value(what, {"model": "tiny"}) or 0.0


def test_requests_that_arrive_together_go_as_one_call_and_each_gets_its_own_rows(
    serving, tiny_runner
):
    serving, engine, model = serving
    requests = [(["a short text"], {}), (["two texts", "in one request"], {}), (["x y z"], {})]
    answers = _together(serving, model, requests)
    # the first at once; the other two, which came while it was at the engine, as one
    assert engine.sizes == [1, 3]
    for (texts, _), answer in zip(requests, answers, strict=True):
        # each request's rows, against the same texts sent alone
        np.testing.assert_allclose(np.asarray(answer.value), _alone(tiny_runner, texts), atol=1e-5)
        assert len(answer.value) == len(texts)
        # its bytes, as a route passes them on, hold the same numbers
        np.testing.assert_allclose(orjson.loads(answer.raw), answer.value, atol=1e-6)
    assert _counted(serving, "neuronserve_front_worker_calls_total") == 2
    assert _counted(serving, "neuronserve_front_worker_requests_total") == 3


def test_a_lone_request_is_sent_alone_and_different_parameters_are_not_joined(serving):
    serving, engine, model = serving
    [answer] = _together(serving, model, [(["alone"], {})])
    assert engine.sizes == [1] and len(answer.value) == 1
    engine.sizes.clear()
    other = {"prompt_name": None}
    requests = [(["a"], {}), (["b"], other), (["c"], {}), (["d"], other), (["e"], {})]
    _together(serving, model, requests)
    # a and b at once; c and e joined; d, alone of its kind, alone
    assert sorted(engine.sizes) == [1, 1, 1, 2]


def test_a_refused_request_fails_alone_and_its_neighbours_are_answered(serving, tiny_runner):
    serving, engine, model = serving
    too_long = " ".join(["word"] * 400)  # over the 128 tokens compiled, truncation off
    answers = _together(serving, model, [(["fine"], {}), ([too_long], {}), (["also fine"], {})])
    assert isinstance(answers[1], RequestError) and answers[1].status == 413
    for texts, answer in ((["fine"], answers[0]), (["also fine"], answers[2])):
        np.testing.assert_allclose(np.asarray(answer.value), _alone(tiny_runner, texts), atol=1e-5)
    # the first at once, then the joined call, refused, then each of its two alone
    assert engine.sizes == [1, 2, 1, 1]


def test_calls_hold_at_most_the_largest_compiled_batch(serving, tiny_runner):
    serving, engine, model = serving
    largest = model.manifest.grid.max_batch
    requests = [([f"text {i}", f"more {i}", f"last {i}"], {}) for i in range(6)]
    answers = _together(serving, model, requests)
    # the first at once, the other five in calls of as many whole requests as fit
    per_call = largest // 3
    assert engine.sizes == [3] + [3 * per_call] * (5 // per_call) + [3] * (5 % per_call)
    for (texts, _), answer in zip(requests, answers, strict=True):
        np.testing.assert_allclose(np.asarray(answer.value), _alone(tiny_runner, texts), atol=1e-5)


def test_an_engine_failure_reaches_every_request_of_the_call(serving):
    serving, engine, model = serving

    async def down(*_: Any) -> Any:
        await asyncio.sleep(0.005)
        raise ConnectionError("engine gone")

    engine.run = down  # type: ignore[method-assign]
    answers = _together(serving, model, [(["a"], {}), (["b"], {}), (["c"], {})])
    assert all(isinstance(a, ConnectionError) for a in answers)
    # and the next requests are served once it is back
    del engine.run
    answers = _together(serving, model, [(["a"], {}), (["b"], {})])
    assert [len(a.value) for a in answers] == [1, 1]


def test_an_engine_that_cannot_take_a_joined_call_is_not_sent_each_request_again(serving):
    serving, engine, model = serving
    served = engine.run

    async def full(model: Any, request: Any) -> Any:
        if engine.sizes:  # the first is answered; then the queue is full
            engine.sizes.append(len(request.texts))
            await asyncio.sleep(0.005)
            raise RequestError("the queue is full", status=503)
        return await served(model, request)

    engine.run = full  # type: ignore[method-assign]
    answers = _together(serving, model, [(["a"], {}), (["b"], {}), (["c"], {})])
    assert len(answers[0].value) == 1
    assert all(isinstance(a, RequestError) and a.status == 503 for a in answers[1:])
    assert engine.sizes == [1, 2]  # the joined call, refused, and nothing more


def test_a_cancelled_request_leaves_the_others_of_its_call_answered(serving):
    serving, _, model = serving

    async def one_gives_up() -> list[Any]:
        calls = [asyncio.ensure_future(serving.predict(model, [t], {})) for t in "abc"]
        await asyncio.sleep(0)
        calls[1].cancel()
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(one_gives_up())
    assert isinstance(answers[1], asyncio.CancelledError)
    assert [len(answers[i].value) for i in (0, 2)] == [1, 1]


def test_every_call_to_the_engine_is_counted_whichever_route_made_it(tmp_path, tiny_runner):
    client, engine, serving = front(
        tmp_path, {"tiny": tiny_runner}, max_client_batch=2, split_client_batches=True
    )
    assert client.post("/embed", json={"inputs": "one"}).status_code == 200
    # ten texts, over a client batch of two (split allowed) and over the model's largest
    # batch of eight: one request, two calls
    texts = [f"text {i}" for i in range(10)]
    assert client.post("/embed", json={"inputs": texts}).status_code == 200
    assert client.post("/invocations", json={"inputs": "sagemaker's"}).status_code == 200
    assert engine.calls == 4  # the in-process engine's own count
    assert _counted(serving, "neuronserve_front_worker_calls_total") == 4
    assert _counted(serving, "neuronserve_front_worker_requests_total") == 3


def test_a_request_is_spread_over_idle_workers_and_its_rows_come_back_in_order(
    serving, tiny_runner
):
    serving, engine, model = serving
    largest = model.manifest.grid.max_batch
    texts = [f"text number {i} " + "with words " * i for i in range(largest)]
    want = _alone(tiny_runner, texts)
    engine.idle = lambda: 2  # type: ignore[method-assign]
    [answer] = _together(serving, model, [(texts, {})])
    assert engine.sizes == [largest // 2, largest // 2]
    np.testing.assert_allclose(np.asarray(answer.value), want, atol=1e-5)
    # too few texts to be worth a second hop, or no idle worker: as few calls as fit
    engine.sizes.clear()
    _together(serving, model, [(texts[:3], {})])
    engine.idle = lambda: 0  # type: ignore[method-assign]
    _together(serving, model, [(texts, {})])
    _together(serving, model, [(texts + texts[:1], {})])
    # over the largest batch: in pieces of even size
    half = -(-(largest + 1) // 2)
    assert engine.sizes == [3, largest, half, largest + 1 - half]
