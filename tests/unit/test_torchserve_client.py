"""The front's TorchServe client when a worker dies: a request TorchServe gave the dying
worker may stay unanswered until TorchServe's response timeout, so a request still
waiting a while after a worker died is sent once more and the first answer taken; with
no death nothing is sent twice, however slow. TorchServe itself: tests/servers."""

from __future__ import annotations

import asyncio

import pytest

from neuronserve.engines.client import WorkerDied
from neuronserve.engines.torchserve import client as ts


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


def _client(monkeypatch, posts: Posts) -> ts.TorchServeClient:
    client = ts.TorchServeClient.__new__(ts.TorchServeClient)
    client._died_at = float("-inf")
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
