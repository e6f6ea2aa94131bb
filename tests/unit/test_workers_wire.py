"""The workers' wire and a worker's socket server, in this process: frames and answers
round-trip and every malformed frame is refused; the worker's queue (one batch of all that
wait, max_queued, queue_timeout_ms, max_batch_delay_ms) over a real unix socket, with a
fake Worker in place of the model (the real workers: tests/servers/test_native.py)."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from neuronserve import metrics
from neuronserve.tasks import RequestError, get_task
from neuronserve.workers.answers import WorkerDied
from neuronserve.workers.client import RETRY_S, Link, _Series
from neuronserve.workers.store import QueuePolicy
from neuronserve.workers.wire import (
    FrameError,
    FrameTooLarge,
    answer,
    ask,
    frame,
    read_frame,
    request_frame,
    results,
)
from neuronserve.workers.worker import INLINE_TEXTS, Served


def _reader(data: bytes) -> asyncio.StreamReader:
    """A stream holding `data`, then its end (made inside the running loop)."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def _read_one(data: bytes, most: int = 1 << 20) -> Any:
    async def read():
        return await read_frame(_reader(data), most)

    return asyncio.run(read())


heads = st.dictionaries(
    st.text(max_size=8), st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=20)), max_size=5
)


@given(heads=st.lists(heads, min_size=1, max_size=4), bodies=st.lists(st.binary(max_size=300)))
def test_frames_round_trip_one_after_another(heads, bodies):
    bodies = (bodies + [b""] * len(heads))[: len(heads)]

    async def read_all():
        reader = _reader(b"".join(frame(h, b) for h, b in zip(heads, bodies, strict=True)))
        got = []
        while (one := await read_frame(reader, 1 << 20)) is not None:
            got.append(one)
        return got

    assert asyncio.run(read_all()) == list(zip(heads, bodies, strict=True))


def _fixed(size: int, head_size: int, rid: int = 5) -> bytes:
    return struct.pack("<IIq", size, head_size, rid)


@pytest.mark.parametrize(
    ("data", "why", "rid"),
    [
        (_fixed(1 << 21, 2) + b"{" * (1 << 21), "over the bound", 5),
        (_fixed(2, 5) + b"{}", "head is longer", 5),
        (_fixed(3, 3) + b"{x}", "not JSON", 5),
        (_fixed(2, 2) + b"[]", "not an object", 5),
        (_fixed(10, 2) + b"{}", "ended inside", None),
        (_fixed(1 << 21, 2) + b"{}", "ended inside", None),
        (b"\x01\x02", "ended inside", None),
    ],
)
def test_a_malformed_frame_is_refused_saying_why(data, why, rid):
    """With its id while the stream is whole after it (its request alone fails), without
    one where the stream ended inside it (its connection cannot go on)."""
    with pytest.raises(FrameError, match=why) as e:
        _read_one(data)
    assert e.value.rid == rid


def test_a_frame_over_the_bound_is_read_past_and_the_next_one_read():
    async def read_both():
        reader = _reader(frame({"id": 3, "texts": ["x" * 5000]}) + frame({"id": 4}, b"body"))
        with pytest.raises(FrameError, match="over the bound") as e:
            await read_frame(reader, 1000)
        return e.value, await read_frame(reader, 1000)

    refused, following = asyncio.run(read_both())
    assert (refused.rid, refused.status) == (3, 413)
    assert following == ({"id": 4}, b"body")


def test_a_request_frame_over_what_a_worker_reads_is_never_made():
    # a control character is 6 bytes of JSON: 12 M of them are 72 MB of frame
    with pytest.raises(FrameTooLarge, match="more than a worker reads"):
        request_frame({"id": 1, "texts": ["\x01" * 12_000_000]})
    assert request_frame({"id": 1, "texts": ["fine"]}) == frame({"id": 1, "texts": ["fine"]})


@pytest.mark.parametrize(
    "sent",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        [np.ones((2, 4), np.float32), np.zeros((0, 4), np.float32), np.full((5, 4), 2.5, "<f4")],
        [[{"entity": "PER", "score": 0.5}], []],
        np.zeros((0, 3), dtype=np.int64),
    ],
    ids=["rows", "token-rows", "json", "empty"],
)
def test_an_answer_carries_a_requests_results_as_they_were(sent):
    """Rows, a matrix per text, or JSON: back as they were, arrays read in place."""
    head, body = _read_one(answer({"id": 9, "status": 200, "tokens": [3, 1]}, sent))
    got = results(head, body)
    assert (head["id"], head["tokens"]) == (9, [3, 1])
    if isinstance(sent, np.ndarray):
        assert got.dtype == sent.dtype and np.array_equal(got, sent)
        assert not got.flags.owndata  # no copy out of the frame
    elif isinstance(sent[0], np.ndarray):
        assert [g.shape for g in got] == [w.shape for w in sent]
        assert all(np.array_equal(g, w) for g, w in zip(got, sent, strict=True))
    else:
        assert got == sent


def test_the_end_of_the_stream_between_frames_is_no_error():
    assert _read_one(b"", 100) is None


class FakeWorker:
    """What Served uses of neuronserve.worker.Worker: a feature-extraction model whose
    result for a text is [len(text), rows in its batch]; `hold` keeps a batch from
    finishing until it is set."""

    def __init__(self, max_batch: int = 8):
        grid = SimpleNamespace(max_batch=max_batch)
        runner = SimpleNamespace(
            task=get_task("feature-extraction"), manifest=SimpleNamespace(grid=grid)
        )
        self.runners = {"m": runner}
        self.hold = threading.Event()
        self.hold.set()
        self.batches: list[int] = []
        # whether `start` returns before the batch runs (a NeuronCore), as Worker says
        self.pipelined = False
        # the thread each batch began on
        self.threads: list[str] = []

    def runner(self, name: str | None) -> Any:
        if name not in (None, "m"):
            raise RequestError(f"no model {name!r} here; served: m", status=404)
        return self.runners["m"]

    def start(self, requests, report) -> Future:
        rows = sum(len(r.texts) for _, r in requests if not isinstance(r, RequestError))
        self.batches.append(len(requests))
        self.threads.append(threading.current_thread().name)
        done: Future = Future()

        def finish():
            self.hold.wait(10)
            done.set_result(
                [
                    r if isinstance(r, RequestError) else [[len(t), rows] for t in r.texts]
                    for _, r in requests
                ]
            )

        threading.Thread(target=finish, daemon=True).start()
        return done


POLICY = QueuePolicy(max_queued=100, queue_timeout_s=None, batch_delay_s=0.0, hang_s=60)


class Peer:
    """One connection to the worker's socket, as the front's client speaks it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def to(cls, path: Path) -> Peer:
        return cls(*await asyncio.open_unix_connection(str(path)))

    def send(self, rid: int, texts: Any, model: str | None = "m") -> None:
        self.writer.write(frame({"op": "infer", "id": rid, "model": model, "texts": texts}))

    async def answers(self, n: int) -> dict[int, tuple[dict[str, Any], Any]]:
        out = {}
        while len(out) < n:
            head, body = await asyncio.wait_for(read_frame(self.reader, 1 << 24), 10)
            if head.get("op") == "metrics":
                continue
            value = None
            if head["status"] == 200:
                value = results(head, body)
            out[head["id"]] = (head, value)
        return out


def _serving(
    tmp_path: Path,
    worker: FakeWorker,
    policy: QueuePolicy = POLICY,
    depth: int = 1,
    path: Path | None = None,
):
    """Run `Served` on a socket in tmp_path (or at `path`); `await started` then talk
    to it."""
    path = path or tmp_path / "w.sock"
    served = Served(worker, depth, policy)  # type: ignore[arg-type]

    async def run(body):
        task = asyncio.create_task(served.serve(path))
        for _ in range(200):
            if path.exists():
                break
            await asyncio.sleep(0.01)
        try:
            return await body(path)
        finally:
            task.cancel()
            served.compute.shutdown(wait=False)

    return served, run


async def until(check: Any, within_s: float = 5.0) -> None:
    """Until the worker's loop got where `check()` says (at most `within_s`)."""
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "the worker never got there"
        await asyncio.sleep(0.002)


def test_requests_waiting_together_run_as_one_batch_each_answered_its_own(tmp_path):
    worker = FakeWorker()
    served, run = _serving(tmp_path, worker)

    async def body(path):
        a, b = await Peer.to(path), await Peer.to(path)
        worker.hold.clear()
        a.send(1, ["first"])  # runs alone, held
        await until(lambda: worker.batches == [1])
        for i in range(2, 6):  # wait meanwhile, from two connections
            (a if i % 2 else b).send(i, ["x" * i, "y"])
        await until(lambda: len(served.queue) == 4)
        worker.hold.set()
        return await a.answers(3), await b.answers(2)

    got_a, got_b = asyncio.run(run(body))
    assert worker.batches == [1, 4]
    assert got_a[1][1] == [[5, 1]]
    for rid, (head, value) in {**got_a, **got_b}.items():
        if rid > 1:
            assert head["status"] == 200 and value == [[rid, 8], [1, 8]]
    assert {1, 3, 5} == set(got_a) and {2, 4} == set(got_b)


class ReportingWorker(FakeWorker):
    """A FakeWorker that reports each batch's run, as Worker.start does."""

    def start(self, requests, report) -> Future:
        from neuronserve.execution import RunReport

        run = RunReport()
        run.requests = len(requests)
        report("m", run)
        return super().start(requests, report)


def _frames_of(data: bytes) -> list[dict[str, Any]]:
    async def read():
        reader, heads = _reader(data), []
        while (got := await read_frame(reader, 1 << 24)) is not None:
            heads.append(got[0])
        return heads

    return asyncio.run(read())


def test_a_batchs_answers_go_in_one_write_per_connection_the_metrics_after_them(
    tmp_path, monkeypatch
):
    from neuronserve.workers import worker as worker_module

    writes: list[tuple[int, bytes]] = []
    send = worker_module.Connection.send

    def recorded(self, data):
        writes.append((id(self), bytes(data)))
        send(self, data)

    monkeypatch.setattr(worker_module.Connection, "send", recorded)
    worker = ReportingWorker()
    served, run = _serving(tmp_path, worker)

    async def body(path):
        a, b = await Peer.to(path), await Peer.to(path)
        worker.hold.clear()
        a.send(1, ["first"])  # runs alone, held
        await until(lambda: worker.batches == [1])
        for i in range(2, 6):  # 2 and 4 from b, 3 and 5 from a: one batch of four
            (a if i % 2 else b).send(i, ["x"])
        await until(lambda: len(served.queue) == 4)
        worker.hold.set()
        return await a.answers(3), await b.answers(2)

    got_a, got_b = asyncio.run(run(body))
    assert worker.batches == [1, 4]
    assert {1, 3, 5} == set(got_a) and {2, 4} == set(got_b)
    # the first batch's write, then one write for each connection of the second
    batch = [[h.get("id") if h.get("op") != "metrics" else "metrics" for h in _frames_of(d)]
             for _, d in writes[1:]]  # fmt: skip
    assert sorted(batch, key=len) == [[3, 5], [2, 4, "metrics"]], batch
    assert len({c for c, _ in writes[1:]}) == 2


class StepWorker(FakeWorker):
    """A FakeWorker whose batches each finish when their own event is set."""

    def __init__(self, max_batch: int):
        super().__init__(max_batch)
        self.holds: list[threading.Event] = []

    def start(self, requests, report) -> Future:
        hold = threading.Event()
        self.holds.append(hold)
        self.hold = hold
        return super().start(requests, report)


def test_while_a_batch_runs_the_next_takes_at_most_one_full_call_of_texts(tmp_path):
    worker = StepWorker(max_batch=3)
    served, run = _serving(tmp_path, worker, depth=2)

    async def body(path):
        peer = await Peer.to(path)
        peer.send(1, ["a"])
        await until(lambda: len(worker.batches) == 1)
        peer.send(2, ["b", "c", "d"])  # the second batch in flight: the device is full
        await until(lambda: len(worker.batches) == 2)
        peer.send(3, ["e", "f"])
        peer.send(4, ["g", "h"])
        peer.send(5, ["i"])
        await until(lambda: len(served.queue) == 3)
        worker.holds[0].set()  # a slot: 3 and 4 would be 4 texts, over the call of 3
        await until(lambda: len(worker.batches) == 3)
        worker.holds[1].set()  # another: 4 and 5 are one call of 3
        await until(lambda: len(worker.batches) == 4)
        for hold in worker.holds:
            hold.set()
        return await peer.answers(5)

    got = asyncio.run(run(body))
    assert worker.batches == [1, 1, 1, 2]
    assert [got[i][0]["status"] for i in range(1, 6)] == [200] * 5
    assert got[4][1] == [[1, 3], [1, 3]] and got[5][1] == [[1, 3]]


@pytest.mark.parametrize("pipelined", [True, False])
def test_a_lone_request_begins_on_the_loop_only_where_the_device_has_threads_of_its_own(
    tmp_path, pipelined
):
    worker = FakeWorker()
    worker.pipelined = pipelined
    _, run = _serving(tmp_path, worker, depth=2)

    async def body(path):
        peer = await Peer.to(path)
        worker.hold.clear()
        peer.send(1, ["lone"])  # nothing in flight
        await until(lambda: len(worker.threads) == 1)
        peer.send(2, ["behind"])  # one batch in flight
        await until(lambda: len(worker.threads) == 2)
        worker.hold.set()
        first = await peer.answers(2)
        peer.send(3, ["many"] * (INLINE_TEXTS + 1))  # alone, but more texts than a few
        answers = await peer.answers(1)
        peer.send(4, ["lone", "again"])
        answers.update(await peer.answers(1))
        return threading.current_thread().name, {**first, **answers}

    loop, got = asyncio.run(run(body))
    begun = ["loop" if t == loop else "batch" if t.startswith("neuronserve-batch") else t
             for t in worker.threads]  # fmt: skip
    assert begun == (["loop", "batch", "batch", "loop"] if pipelined else ["batch"] * 4)
    assert [got[i][0]["status"] for i in range(1, 5)] == [200] * 4
    assert got[1][1] == [[4, 1]] and got[3][1] == [[4, INLINE_TEXTS + 1]] * (INLINE_TEXTS + 1)
    assert got[4][1] == [[4, 2], [5, 2]]


def test_a_bad_request_is_answered_alone_and_its_batch_neighbours_are_served(tmp_path):
    worker = FakeWorker()
    served, run = _serving(tmp_path, worker)

    async def body(path):
        peer = await Peer.to(path)
        worker.hold.clear()
        peer.send(1, ["held"])
        await until(lambda: worker.batches == [1])
        peer.send(2, ["fine"])
        peer.send(3, [["not", "a", "pair"]])
        peer.send(4, ["also fine"], model="other")
        peer.send(5, [])
        peer.send(6, ["fine too"])
        await until(lambda: len(served.queue) == 5)
        worker.hold.set()
        return await peer.answers(6)

    got = asyncio.run(run(body))
    assert [got[i][0]["status"] for i in range(1, 7)] == [200, 200, 400, 404, 400, 200]
    assert "a pair of texts" in got[3][0]["error"] and "served: m" in got[4][0]["error"]
    assert got[2][1] == [[4, 2]] and got[6][1] == [[8, 2]]


def test_a_malformed_frame_fails_its_own_request_alone(tmp_path, monkeypatch):
    """A frame whose head does not parse, and one over the worker's bound: each is
    answered with its own id, and the same connection goes on serving. A frame without
    an id (no request to answer), or a stream ended inside a frame, closes its own
    connection and nothing else."""
    monkeypatch.setattr("neuronserve.workers.worker.MAX_REQUEST_BYTES", 1 << 16)
    worker = FakeWorker()
    _, run = _serving(tmp_path, worker)

    async def body(path):
        good, bad = await Peer.to(path), await Peer.to(path)
        bad.writer.write(struct.pack("<IIq", 5, 5, 8) + b"nope!")
        bad.send(9, ["x" * (1 << 17)])  # over the bound
        bad.send(10, ["served after both"])
        answered = await bad.answers(3)
        no_id, no_id_w = await asyncio.open_unix_connection(str(path))
        no_id_w.write(frame({"op": "infer", "texts": ["x"]}))
        closed = await asyncio.wait_for(no_id.read(), 5)
        cut, cut_w = await asyncio.open_unix_connection(str(path))
        cut_w.write(struct.pack("<IIq", 100, 2, 11) + b"{}")
        cut_w.write_eof()
        closed_too = await asyncio.wait_for(cut.read(), 5)
        good.send(7, ["still served"])
        return answered, closed, closed_too, await good.answers(1)

    answered, closed, closed_too, got = asyncio.run(run(body))
    assert answered[8][0]["status"] == 400 and "not JSON" in answered[8][0]["error"]
    assert answered[9][0]["status"] == 413 and "over the bound" in answered[9][0]["error"]
    assert answered[10][0]["status"] == 200 and answered[10][1] == [[17, 1]]
    assert closed == b"" and closed_too == b""
    assert got[7] == ({"id": 7, "status": 200, "tokens": None, "results": [[12, 1]]}, [[12, 1]])


def test_beyond_max_queued_a_request_gets_503_at_once(tmp_path):
    worker = FakeWorker()
    policy = QueuePolicy(max_queued=2, queue_timeout_s=None, batch_delay_s=0.0, hang_s=60)
    _, run = _serving(tmp_path, worker, policy)

    async def body(path):
        peer = await Peer.to(path)
        worker.hold.clear()
        peer.send(1, ["running"])
        await until(lambda: worker.batches == [1])
        for i in (2, 3, 4):
            peer.send(i, ["waits"])
        refused = await peer.answers(1)  # before the held batch ends
        worker.hold.set()
        return refused, await peer.answers(3)

    refused, rest = asyncio.run(run(body))
    assert list(refused) == [4] and refused[4][0]["status"] == 503
    assert "max_queued" in refused[4][0]["error"]
    assert [rest[i][0]["status"] for i in (1, 2, 3)] == [200, 200, 200]


def test_a_request_that_waited_past_the_queue_timeout_gets_503(tmp_path):
    worker = FakeWorker()
    policy = QueuePolicy(max_queued=10, queue_timeout_s=0.1, batch_delay_s=0.0, hang_s=60)
    served, run = _serving(tmp_path, worker, policy)

    async def body(path):
        peer = await Peer.to(path)
        worker.hold.clear()
        peer.send(1, ["running"])
        await until(lambda: worker.batches == [1])
        peer.send(2, ["waits too long"])
        await asyncio.sleep(0.2)
        peer.send(3, ["just came"])
        await until(lambda: len(served.queue) == 2)
        worker.hold.set()
        return await peer.answers(3)

    got = asyncio.run(run(body))
    assert [got[i][0]["status"] for i in (1, 2, 3)] == [200, 503, 200]
    assert "queue_timeout_ms" in got[2][0]["error"]


def test_the_batch_delay_holds_a_lone_request_for_others_to_join(tmp_path):
    worker = FakeWorker(max_batch=3)
    # a delay long beside a loaded host's stall, so that "at once" is told from "after it"
    policy = QueuePolicy(max_queued=10, queue_timeout_s=None, batch_delay_s=0.6, hang_s=60)
    _, run = _serving(tmp_path, worker, policy)

    async def body(path):
        peer = await Peer.to(path)
        peer.send(1, ["first"])
        await asyncio.sleep(0.1)
        peer.send(2, ["joins"])
        first = await peer.answers(2)
        # a full batch goes at once: no wait for the delay
        loop = asyncio.get_running_loop()
        began = loop.time()
        peer.send(3, ["a", "b", "c"])
        full = await peer.answers(1)
        return first, full, loop.time() - began

    first, full, took = asyncio.run(run(body))
    assert worker.batches == [2, 1]
    assert first[1][1] == [[5, 2]] and first[2][1] == [[5, 2]]
    assert full[3][0]["status"] == 200 and took < 0.5


def test_a_ping_says_how_long_the_oldest_batch_runs(tmp_path):
    worker = FakeWorker()
    _, run = _serving(tmp_path, worker)

    async def body(path):
        peer = await Peer.to(path)
        peer.writer.write(frame({"op": "ping", "id": 9}))
        idle = await asyncio.wait_for(read_frame(peer.reader, 1 << 20), 5)
        worker.hold.clear()
        peer.send(1, ["held"])
        await asyncio.sleep(0.1)
        peer.writer.write(frame({"op": "ping", "id": 10}))
        busy = await asyncio.wait_for(read_frame(peer.reader, 1 << 20), 5)
        worker.hold.set()
        return idle, busy

    (idle, _), (busy, _) = asyncio.run(run(body))
    assert idle["busy_s"] is None and idle["models"] == ["m"]
    assert busy["id"] == 10 and busy["busy_s"] >= 0.09


def test_a_worker_that_closes_its_connection_fails_its_requests_with_worker_died(tmp_path):
    path = tmp_path / "dies.sock"

    async def body():
        async def swallow(reader, writer):
            await reader.readexactly(8)  # half a frame, then gone
            writer.close()

        server = await asyncio.start_unix_server(swallow, path=str(path))
        link = Link(0, path, lambda values: None)
        assert await link.connect()
        await asyncio.sleep(RETRY_S * 1.5)  # no throttle left from that connect
        try:
            with pytest.raises(WorkerDied, match="worker 0 "):
                await asyncio.wait_for(link.ask(1, frame({"op": "infer", "id": 1})), 5)
            # its socket still listens (a dying process closes its connections first):
            # the request's second try must not be sent there at once
            assert not await link.connect()
        finally:
            server.close()
        return link

    link = asyncio.run(body())
    assert not link.up and not link.waiting


def test_the_engine_series_sum_counters_and_keep_the_last_gauge():
    series = _Series()
    series.add([["requests", 3, {"model": "m"}], ["batch_requests", 3, {"model": "m"}]])
    series.add([["requests", 2, {"model": "m"}], ["batch_requests", 2, {"model": "m"}]])
    series.add(
        [
            ["not_ours", 1, {}],
            ["bucket_runs", 1, {"model": "m", "bucket": "b1_s16", "batch_size": "1"}],
            ["requests", 4, {"model": "n"}],
            ["batch_requests", 4, {"model": "n"}],
        ]
    )
    series.add([["requests", 1, {"model": "n"}], ["batch_requests", 1, {"model": "m"}]])
    text = generate_latest(series.registry).decode()
    assert 'neuronserve_requests_total{model="m"} 5.0' in text
    assert 'neuronserve_requests_total{model="n"} 5.0' in text
    assert 'neuronserve_batch_requests{model="m"} 1.0' in text
    assert 'neuronserve_batch_requests{model="n"} 4.0' in text
    assert 'neuronserve_bucket_runs_total{batch_size="1",bucket="b1_s16",model="m"} 1.0' in text
    assert "not_ours" not in text
    assert {m.name for m in metrics.METRICS} >= {"requests", "batch_requests", "bucket_runs"}


def test_a_socket_in_a_folder_too_deep_for_its_address_is_served_and_reached(tmp_path):
    """A unix socket's address holds at most 107 bytes of path: a deep run folder's
    socket is bound and reached through its folder's descriptor, by the front's client
    and by the supervisor's ping alike."""
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "sockets"
    deep.mkdir(parents=True)
    path = deep / "worker0.sock"
    assert len(str(path)) > 107
    worker = FakeWorker()
    _, run = _serving(tmp_path, worker, path=path)

    async def body(path):
        link = Link(0, path, lambda values: None)
        assert await link.connect()
        answer, _ = await link.ask(1, frame({"op": "infer", "id": 1, "model": "m",
                                              "texts": ["deep"]}))  # fmt: skip
        pinged = await asyncio.to_thread(ask, str(path), {"id": 0, "op": "ping"}, 5)
        return answer, pinged

    answer, pinged = asyncio.run(run(body))
    assert answer["status"] == 200 and pinged["status"] == 200
    assert path.is_socket()


def test_a_request_too_large_for_its_worker_fails_alone_in_the_front(tmp_path, tiny_artifact):
    """Other clients' requests in flight on the worker's one connection while a request
    whose frame the worker would refuse is sent (120 texts of control characters within
    every request limit, which JSON writes as 72 MB): that request alone is refused (413)
    in the front, it never reaches the worker, every other request is answered, and the
    connection they share stays up (before, the worker closed it under them all)."""
    from neuronserve.artifact import read_manifest
    from neuronserve.served import ServedModel
    from neuronserve.tasks import TaskRequest
    from neuronserve.workers.client import SocketClient
    from neuronserve.workers.supervisor import socket_path

    run_dir = tmp_path / "run"
    path = socket_path(run_dir, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    worker = FakeWorker()
    manifest = read_manifest(tiny_artifact)
    model = ServedModel("m", manifest, False, None, None)
    _, run = _serving(tmp_path, worker, path=path)

    async def body(path):
        client = SocketClient("native", run_dir, 1)
        worker.hold.clear()
        first = asyncio.create_task(client.run(model, TaskRequest(["first"], False)))
        await until(lambda: worker.batches == [1])
        link = client._links[0]
        connection = link.writer
        others = [
            asyncio.create_task(client.run(model, TaskRequest([f"text {i}"], False)))
            for i in range(40)
        ]
        await asyncio.sleep(0)
        big = TaskRequest(["\x01" * 100_000] * 120, False)
        with pytest.raises(RequestError) as refused:
            await client.run(model, big)
        worker.hold.set()
        answers = await asyncio.gather(first, *others)
        return refused.value, answers, link.writer is connection

    refused, answers, same_connection = asyncio.run(run(body))
    assert refused.status == 413 and "more than a worker reads" in refused.message
    assert len(answers) == 41 and all(len(a) == 1 for a in answers)
    assert same_connection
    assert sum(worker.batches) == 41  # the big request never reached the worker
