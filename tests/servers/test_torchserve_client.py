"""The front's TorchServe client when a worker dies: a request TorchServe gave the dying
worker may stay unanswered until TorchServe's response timeout, so a request still
waiting a while after a worker died is sent once more and the first answer taken; with
no death nothing is sent twice, however slow. A death is seen from another request's
answer or from the workers' processes (the management API's pids, read here from real
processes, so it is here and not in tests/unit). TorchServe itself: test_torchserve.py
and the soak."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from neuronserve.engines.client import WorkerDied
from neuronserve.engines.torchserve import client as ts
from neuronserve.engines.torchserve.process import worker_counts_of

pytestmark = pytest.mark.server


class Posts:
    """`_post` as TorchServe answers: the first call never answers (a job lost with its
    worker) unless `answer_first`; later ones answer at once."""

    def __init__(self, answer_first: bool = False, first_after: float = 0.0):
        self.calls = 0
        self.answer_first, self.first_after = answer_first, first_after
        self.cancelled = False

    async def __call__(self, body: bytes, headers: dict) -> tuple[int, bytes, None]:
        self.calls += 1
        if self.calls == 1:
            try:
                if not self.answer_first:
                    await asyncio.Event().wait()
                await asyncio.sleep(self.first_after)
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            return 200, b"first", None
        return 200, b"again", None


def _client(monkeypatch, posts: Posts, pids: list[int] | None = None) -> ts.TorchServeClient:
    """A client of one model whose workers are the processes `pids` (this one)."""
    client = ts.TorchServeClient.__new__(ts.TorchServeClient)
    client._died_at = float("-inf")
    workers = [os.getpid()] if pids is None else pids
    client._workers, client._counts = 1, worker_counts_of

    async def entries() -> list[dict]:
        return [{"minWorkers": 1, "workers": [{"status": "READY", "pid": p} for p in workers]}]

    monkeypatch.setattr(client, "_entries", entries)
    monkeypatch.setattr(client, "_post", posts)
    monkeypatch.setattr(ts, "HEDGE_AFTER_DEATH_S", 0.05)
    return client


def test_a_request_unanswered_after_a_worker_died_is_sent_again(monkeypatch):
    posts = Posts()
    client = _client(monkeypatch, posts)

    async def scenario():
        sending = asyncio.ensure_future(client._send(b"{}", {}, "a request"))
        while posts.calls == 0:  # until the request is at TorchServe
            await asyncio.sleep(0)
        client._died_at = ts.time.monotonic()  # another request answered "Worker died"
        return await asyncio.wait_for(sending, 5)

    assert asyncio.run(scenario()) == (200, b"again", None)
    assert posts.calls == 2 and posts.cancelled  # the lost one is given up


def test_a_request_its_dead_worker_alone_held_is_sent_again_once_replaced(monkeypatch):
    """No request answered "Worker died" (the dead worker held only this one): the worker
    TorchServe started in its place after the request was sent says a worker died."""
    posts, pids = Posts(), [os.getpid()]
    client = _client(monkeypatch, posts, pids)
    replacement = None

    async def scenario():
        nonlocal replacement
        sending = asyncio.ensure_future(client._send(b"{}", {}, "a request"))
        while posts.calls == 0:  # until the request is at TorchServe
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)  # ticks past: the same workers, nothing sent again
        assert posts.calls == 1
        replacement = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        pids[0] = replacement.pid
        return await asyncio.wait_for(sending, 5)

    try:
        assert asyncio.run(scenario()) == (200, b"again", None)
        assert posts.calls == 2 and posts.cancelled
    finally:
        if replacement is not None:
            replacement.kill()
            replacement.wait()


def test_a_worker_gone_and_not_yet_replaced_sends_an_unanswered_request_again(monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    posts = Posts()
    client = _client(monkeypatch, posts, [dead.pid])
    started = time.monotonic()
    assert asyncio.run(asyncio.wait_for(client._send(b"{}", {}, "a request"), 5)) == (
        200,
        b"again",
        None,
    )
    assert posts.calls == 2 and time.monotonic() - started < 2


def test_without_a_death_a_slow_request_is_sent_once(monkeypatch):
    posts = Posts(answer_first=True, first_after=0.3)
    client = _client(monkeypatch, posts)
    assert asyncio.run(client._send(b"{}", {}, "a request")) == (200, b"first", None)
    assert posts.calls == 1


def test_a_death_before_the_request_was_sent_does_not_resend_it(monkeypatch):
    posts = Posts(answer_first=True, first_after=0.3)
    client = _client(monkeypatch, posts)
    client._died_at = ts.time.monotonic() - 1
    assert asyncio.run(client._send(b"{}", {}, "a request")) == (200, b"first", None)
    assert posts.calls == 1


def test_a_worker_death_answered_is_sent_once_more_as_before(monkeypatch):
    answers = [WorkerDied("TorchServe's worker died"), (200, b"second", None)]

    async def post(body, headers):
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    client = _client(monkeypatch, Posts())
    monkeypatch.setattr(client, "_post", post)
    assert asyncio.run(client._send(b"{}", {}, "a request")) == (200, b"second", None)
    with pytest.raises(IndexError):
        answers.pop(0)
