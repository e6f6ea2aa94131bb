"""The front's client of its workers: one connection to each worker's socket, many
requests in flight on it (each frame carries its id), a request sent to the worker with
the fewest waiting. A worker that dies with requests fails them with WorkerDied, and the
front sends each once more to another (answers.py: once_more); the supervisor's
replacement is connected to once its socket answers. The workers' series (what each
batch did, neuronserve.metrics) arrive with the answers and are kept here."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .. import metrics, traffic
from ..tasks import RequestError
from ..tracing import TRACING, parse_stages
from .answers import WorkerClient, WorkerCounts, WorkerDied, WorkersUnavailable, once_more
from .process import ready, states
from .supervisor import socket_path
from .wire import (
    MAX_ANSWER_BYTES,
    FrameError,
    FrameTooLarge,
    reachable,
    read_frame,
    request_frame,
    results,
)

if TYPE_CHECKING:
    from ..served import ServedModel
    from ..tasks import TaskRequest

# how often a worker that is down is tried again (its replacement's socket)
RETRY_S = 0.2


class Link:
    """One worker's connection: its requests in flight, by id."""

    def __init__(self, index: int, path: Path, keep: Any):
        self.index, self.path, self._keep = index, path, keep
        self.writer: asyncio.StreamWriter | None = None
        self.waiting: dict[int, asyncio.Future[tuple[dict[str, Any], memoryview]]] = {}
        self.tried = 0.0
        self._connecting: asyncio.Future[bool] | None = None

    @property
    def up(self) -> bool:
        return self.writer is not None and not self.writer.is_closing()

    async def connect(self) -> bool:
        """Whether the worker answers now (connecting to it if it is not connected);
        one attempt at a time, and at most every RETRY_S."""
        if self.up:
            return True
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        if time.monotonic() - self.tried < RETRY_S:
            return False
        self.tried = time.monotonic()
        self._connecting = asyncio.get_running_loop().create_future()
        try:
            with reachable(self.path) as address:
                reader, self.writer = await asyncio.open_unix_connection(address)
        except OSError:
            self.writer = None
        else:
            asyncio.get_running_loop().create_task(self._read(reader, self.writer))
        self._connecting.set_result(self.up)
        self._connecting = None
        return self.up

    async def ask(self, rid: int, data: bytes) -> tuple[dict[str, Any], memoryview]:
        assert self.writer is not None
        answer = asyncio.get_running_loop().create_future()
        self.waiting[rid] = answer
        writer = self.writer
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionError, OSError) as e:
            self.waiting.pop(rid, None)
            # down now, before the reader notices: the request's second try must not
            # come back here
            self._down(writer, f"broke its connection ({e})")
            raise WorkerDied(f"worker {self.index} is gone", str(self.index)) from None
        return await answer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        why = "closed its connection"
        try:
            while True:
                try:
                    got = await read_frame(reader, MAX_ANSWER_BYTES)
                except FrameError as e:
                    failed = self.waiting.pop(e.rid, None) if e.rid is not None else None
                    if e.rid is None:
                        raise
                    if failed is not None and not failed.done():  # its request alone
                        failed.set_exception(RequestError(f"the worker's answer: {e}", 500))
                    continue
                if got is None:
                    break
                head, body = got
                if head.get("op") == "metrics":
                    # after the answers it follows: their requests go on first
                    asyncio.get_running_loop().call_soon(self._keep, head.get("values") or [])
                    continue
                rid = head.get("id")
                answer = self.waiting.pop(rid, None) if isinstance(rid, int) else None
                if answer is not None and not answer.done():
                    answer.set_result((head, body))
        except (FrameError, ConnectionError, OSError) as e:
            why = f"broke its connection ({e})"
        finally:
            self._down(writer, why)

    def _down(self, writer: asyncio.StreamWriter, why: str) -> None:
        """The connection `writer` writes to is gone: every request waiting on it fails
        with WorkerDied (the front sends each once more, to another worker)."""
        if self.writer is not writer:
            return  # already down (a connection since is another's)
        self.writer = None
        # a dying worker closes its connections before its socket: no new connection
        # for RETRY_S, or a request's second try could reach the same dying process
        self.tried = time.monotonic()
        writer.close()
        died = WorkerDied(f"worker {self.index} {why}", str(self.index))
        for answer in self.waiting.values():
            if not answer.done():
                answer.set_exception(died)
        self.waiting.clear()


class SocketClient(WorkerClient):
    def __init__(self, name: str, run_dir: Path, workers: int):
        self._name, self._run_dir, self._workers = name, Path(run_dir), workers
        self._keeping = _Series()
        self._links = [Link(i, socket_path(run_dir, i), self._keeping.add) for i in range(workers)]
        self._ids = itertools.count(1)

    async def run(self, model: ServedModel, request: TaskRequest) -> Any:
        head: dict[str, Any] = {
            "op": "infer",
            "model": model.worker_name,
            "parameters": request.parameters,
            "truncate": request.truncate,
            "direction": request.truncation_direction,
        }
        if TRACING.recording():  # the worker's stages come back with its answer
            head["trace"] = True
        body = b""
        if model.handler.images:
            images = [bytes(t) for t in request.texts]  # type: ignore[arg-type]
            head["images"], body = [len(b) for b in images], b"".join(images)
        else:
            head["texts"] = request.texts  # a pair (a tuple) is written as a list of two

        async def send() -> Any:
            rid = next(self._ids)
            try:  # a frame the worker would refuse never reaches it: the request's own 413
                data = request_frame({**head, "id": rid}, body)
            except FrameTooLarge as e:
                raise RequestError(str(e), 413) from None
            link = await self._pick()
            answer, raw = await link.ask(rid, data)
            if "stages" in answer:
                TRACING.stages(parse_stages(answer["stages"], worker=link.index))
            if answer.get("status") != 200:
                raise RequestError(
                    str(answer.get("error", "")), int(answer.get("status", 500)), answer.get("kind")
                )
            request.tokens = answer.get("tokens")
            return results(answer, raw)

        return await once_more(send, f"a request to {model.name}")

    async def _pick(self) -> Link:
        """The worker with the fewest requests waiting of those that answer."""
        up = [link for link in self._links if link.up]
        if len(up) < len(self._links):  # one is down: its replacement may be back
            tried = await asyncio.gather(*(link.connect() for link in self._links if not link.up))
            if any(tried):
                up = [link for link in self._links if link.up]
        if not up:
            raise WorkersUnavailable("no worker answers")
        return min(up, key=lambda link: len(link.waiting))

    def idle(self) -> int:
        return sum(1 for link in self._links if link.up and not link.waiting)

    async def health(self) -> WorkerCounts:
        found = await asyncio.to_thread(states, self._run_dir)
        return WorkerCounts(ready(found), self._workers)

    async def metrics(self) -> str:
        return generate_latest(self._keeping.registry).decode()

    async def close(self) -> None:
        for link in self._links:
            if link.writer is not None:
                link.writer.close()


class _Series:
    """The workers' series (neuronserve.metrics, Prometheus' names), from what each
    batch reported: counters summed, gauges at the last value."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._made: dict[str, Any] = {}
        # each series' labelled child, by name and labels: every batch reports the same
        # few, and prometheus_client's `labels` costs more than the update it precedes
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}
        # what `neuronserve tune` reads back (traffic.py): the rows of each device call
        self.rows = Histogram(
            traffic.BATCH_ROWS,
            "Rows each device call of the workers ran (the batch sizes formed), by model",
            [metrics.MODEL_LABEL],
            buckets=traffic.ROW_BUCKETS,
            registry=self.registry,
        )
        self._rows: dict[str, Any] = {}

    def add(self, values: list[Any]) -> None:
        for name, value, labels in values:
            metric = metrics.BY_NAME.get(name)
            if metric is None or not isinstance(labels, dict):
                continue
            if metric is metrics.BUCKET_RUNS:  # one device call of batch_size rows
                model = str(labels.get(metrics.MODEL_LABEL, ""))
                child = self._rows.get(model) or self._rows.setdefault(
                    model, self.rows.labels(model)
                )
                child.observe(float(labels.get("batch_size", 0)))
            series = self._made.get(name)
            if series is None:
                kind = Counter if metric.kind == "counter" else Gauge
                names = [metrics.MODEL_LABEL, *metric.labels]
                series = kind(metric.snake_name, metric.description, names, registry=self.registry)
                self._made[name] = series
            key = (name, tuple(str(labels.get(n, "")) for n in series._labelnames))
            labelled = self._children.get(key)
            if labelled is None:
                labelled = self._children[key] = series.labels(*key[1])
            if isinstance(labelled, Gauge):
                labelled.set(float(value))
            else:
                labelled.inc(float(value))
