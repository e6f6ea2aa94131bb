"""A worker: one process per core group, started by the supervisor, answering the front
on a unix socket in the workers' run folder (wire.py).

    python -m neuronserve.workers.worker MODEL_DIR SOCKET INDEX

It leases its core group (INDEX is the one it prefers), pins to it and loads every model
of the deployment (neuronserve.worker.start_worker: nothing imports torch before the pin),
then opens its socket, 0600: the supervisor takes a socket that answers for a worker
that is ready. Requests from every connection wait in one queue; when the worker can take
a batch it takes all that wait (the Runner runs them in its buckets, each model's in a
call of its own). On the CPU a batch runs on a thread of its own while the event loop
reads and parses; on a NeuronCore the worker holds `batches_in_flight` batches at once,
so the device runs one while the host prepares the next and answers the last. The
thread that finishes a batch sends its answers (Connection). A request that cannot be
served is answered alone; a frame that does not parse closes its connection alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RequestError, internal_error
from ..tracing import BatchStages
from .wire import MAX_REQUEST_BYTES, FrameError, answer, frame, reachable, read_frame

if TYPE_CHECKING:
    from ..runtime import Runner
    from ..tasks.base import Task, TaskRequest
    from ..tracing import Stage
    from ..worker import Worker, WorkerSettings
    from .store import QueuePolicy

log = logging.getLogger("neuronserve.workers")

# the most texts of a lone request this worker's loop tokenizes itself (Served._alone)
INLINE_TEXTS = 4
# how long an answer waits for a front that reads nothing before its connection is closed
SEND_TIMEOUT_S = 30.0


class Connection:
    """One connection of the front's, written to by whichever thread has its answer: the
    thread that finishes a batch sends its answers itself, so a request's way back wakes
    no event loop. Its own descriptor of the socket (closed with it, so a frame never
    reaches a connection that took the number), a frame whole under a lock."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.fd = os.dup(writer.get_extra_info("socket").fileno())
        self.closed = False
        self._lock = threading.Lock()

    def send(self, data: bytes) -> None:
        with self._lock:
            view = memoryview(data)
            while view and not self.closed:
                try:
                    view = view[os.write(self.fd, view) :]
                except BlockingIOError:  # the front reads slower than this writes
                    writable = select.poll()  # not select(): a descriptor may be past 1024
                    writable.register(self.fd, select.POLLOUT)
                    if not writable.poll(SEND_TIMEOUT_S * 1000):
                        self._close()
                except OSError:  # the front closed it
                    self._close()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


@dataclass
class Waiting:
    """A request read and parsed, waiting for a batch."""

    connection: Connection
    id: int
    # the model it was parsed for, found once (None: refused before)
    runner: Runner | None
    request: Any  # TaskRequest, or the RequestError it is answered with
    arrived: float = field(default_factory=time.monotonic)
    # a traced request: its worker's stages go back with its answer (neuronserve.tracing)
    traced: bool = False
    arrived_ns: int = field(default_factory=time.time_ns)

    @property
    def rows(self) -> int:
        texts = getattr(self.request, "texts", None)
        return len(texts) if texts is not None else 0


@dataclass
class Served:
    """The worker's socket server and its one queue of requests."""

    worker: Worker
    # batches held at once: 1 where the same cores run the model (CPU)
    depth: int
    policy: QueuePolicy
    queue: list[Waiting] = field(default_factory=list)
    # when each batch in flight began (for the supervisor's hang check)
    started: dict[int, float] = field(default_factory=dict)
    batches: int = 0

    async def serve(self, path: Path) -> None:
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        # one thread begins batches: on the CPU it runs them; on a NeuronCore it hands
        # them to the Runner, whose own threads finish them
        self.compute = ThreadPoolExecutor(1, thread_name_prefix="neuronserve-batch")
        path.unlink(missing_ok=True)
        with reachable(path) as address:
            server = await asyncio.start_unix_server(self.connection, path=address)
        os.chmod(path, 0o600)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, stop.set)
        batching = asyncio.create_task(self.batching())
        log.info("serving on %s", path)
        await stop.wait()
        server.close()
        batching.cancel()
        self.compute.shutdown(wait=False, cancel_futures=True)

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(writer)
        try:
            while True:
                try:
                    got = await read_frame(reader, MAX_REQUEST_BYTES)
                except FrameError as e:
                    if e.rid is None:
                        raise
                    # read past: its request alone is answered, the connection goes on
                    refused = RequestError(str(e), status=e.status)
                    conn.send(self._answer_frame(Waiting(conn, e.rid, None, refused), refused))
                    continue
                if got is None:
                    break
                head, body = got
                op = head.get("op")
                if op == "infer":
                    self.take(conn, head, body)
                elif op == "ping":
                    conn.send(frame({"id": head.get("id"), "status": 200, **self.state()}))
                else:
                    raise FrameError(f"unknown op {op!r}")
        except FrameError as e:
            log.warning("a connection sent what is not a frame, closed: %s", e)
        except (ConnectionError, OSError):
            pass
        finally:
            conn.close()
            writer.close()

    def state(self) -> dict[str, Any]:
        """How the worker is: its models, requests waiting, and since when its oldest
        batch in flight runs (None: none runs)."""
        oldest = min(self.started.values(), default=None)
        return {
            "pid": os.getpid(),
            "models": list(self.worker.runners),
            "waiting": len(self.queue),
            "busy_s": None if oldest is None else time.monotonic() - oldest,
        }

    def take(self, conn: Connection, head: dict[str, Any], body: memoryview) -> None:
        """Parse one request and queue it (a request that cannot be parsed is answered
        at once, its error alone)."""
        rid, model = head.get("id"), head.get("model")
        if not isinstance(rid, int):
            raise FrameError("a request without an integer id")
        if len(self.queue) >= self.policy.max_queued:
            full = RequestError(
                f"the worker's queue is full ({self.policy.max_queued} requests wait: "
                "max_queued); try again",
                status=503,
            )
            conn.send(self._answer_frame(Waiting(conn, rid, None, full), full))
            return
        runner = None
        try:
            if model is not None and not isinstance(model, str):
                raise RequestError('"model" must be a model name')
            runner = self.worker.runner(model)
            parsed: Any = _request(runner.task, head, body)
        except RequestError as e:
            parsed = e
        self.queue.append(Waiting(conn, rid, runner, parsed, traced=head.get("trace") is True))
        self.wake.set()

    async def batching(self) -> None:
        """Take the waiting requests as one batch whenever fewer than `depth` run (after
        holding a lone request up to the batch delay, for others to join it)."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.queue and len(self.started) < self.depth:
                await self._fill()
                batch = self._expired(self._take())
                if not batch:
                    continue
                self.batches += 1
                number = self.batches
                self.started[number] = time.monotonic()
                if self._alone(batch):
                    self._begin(batch, number)
                else:
                    self.compute.submit(self._begin, batch, number)

    def _alone(self, batch: list[Waiting]) -> bool:
        """Whether this loop begins `batch` itself: one request of a few texts, nothing
        else in flight, and a device with threads of its own. It tokenizes them and
        hands them to the device's thread, one thread hand-off fewer on a lone request's
        way; under load, a large request (the loop would not read meanwhile) or on the
        CPU (where a batch runs where it begins) the batch thread begins batches."""
        return (
            len(self.started) == 1
            and len(batch) == 1
            and batch[0].rows <= INLINE_TEXTS
            and self.worker.pipelined
        )

    def _most_rows(self) -> int:
        """The largest batch a model here was compiled for."""
        return max((r.manifest.grid.max_batch for r in self.worker.runners.values()), default=1)

    def _take(self) -> list[Waiting]:
        """The next batch: every waiting request when none runs (the Runner groups them
        for the device); while another batch runs, whole requests up to the largest
        compiled batch of texts (at least one), the rest left for the batch after it,
        which the requests still arriving fill: a batch that must wait for the device
        anyway is one full call, not a full call and a small one."""
        if not self.started:
            batch, self.queue = self.queue, []
            return batch
        most, rows, cut = self._most_rows(), 0, 0
        for w in self.queue:
            if cut and rows + w.rows > most:
                break
            rows, cut = rows + w.rows, cut + 1
        batch, self.queue = self.queue[:cut], self.queue[cut:]
        return batch

    async def _fill(self) -> None:
        """Until the batch delay since the oldest waiting request has passed, or the
        waiting requests fill the largest batch a model was compiled for."""
        if self.policy.batch_delay_s <= 0:
            return
        most = self._most_rows()
        deadline = self.queue[0].arrived + self.policy.batch_delay_s
        while sum(w.rows for w in self.queue) < most:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), left)

    def _expired(self, waiting: list[Waiting]) -> list[Waiting]:
        """The requests that may still run: one that waited past the queue timeout is
        answered 503 now."""
        limit = self.policy.queue_timeout_s
        if limit is None:
            return waiting
        now, kept = time.monotonic(), []
        for w in waiting:
            if now - w.arrived > limit and not isinstance(w.request, RequestError):
                late = RequestError(
                    f"the request waited over {limit * 1000:.0f} ms in the worker's queue "
                    "(queue_timeout_ms); try again",
                    status=503,
                )
                w.connection.send(self._answer_frame(w, late))
            else:
                kept.append(w)
        return kept

    def _begin(self, batch: list[Waiting], number: int) -> None:
        """Begin a batch (on the batch thread): its answers are made on the thread that
        finishes it and handed to the event loop once, with the batch's metrics."""
        from ..metrics import batch_values

        metrics: list[Any] = []
        stages = BatchStages(len(batch))

        def report(model: str, run: Any) -> None:  # each model's part, before the answers
            metrics.extend([m.name, v, labels] for m, v, labels in batch_values(run, model))
            stages.add(model, run.stages)

        try:
            started = self.worker.start([(w.runner, w.request) for w in batch], report)
        except Exception:
            log.exception("beginning a batch")
            failed: Future[list[Any]] = Future()
            failed.set_result([internal_error("serving the batch")] * len(batch))
            started = failed
        started.add_done_callback(lambda f: self._done(f, batch, number, metrics, stages))

    def _done(
        self,
        started: Future[list[Any]],
        batch: list[Waiting],
        number: int,
        metrics: list[Any],
        stages: BatchStages,
    ) -> None:
        """A batch's results (on the thread that finished it): each request's answer
        frame, made here, sent by the event loop."""
        try:
            results = started.result()
        except Exception:
            log.exception("serving a batch")
            results = [internal_error("serving the batch")] * len(batch)
        frames = self._frames(batch, results, metrics, self.started.get(number), stages)
        self._send(batch, frames, number)

    def _frames(
        self,
        batch: list[Waiting],
        results: list[Any],
        metrics: list[Any],
        began: float | None = None,
        stages: BatchStages | None = None,
    ) -> list[bytes]:
        """Each request's answer frame, then the batch's metrics (neuronserve.metrics) for
        the front, which keeps the workers' series, on the first request's connection:
        what each model's Runner reported, and the worker's whole time on the batch from
        its start until its answers are made (`began`), shared by its requests. A
        traced request's frame carries the worker's stages: its wait in the queue, then
        the batch's (tokenizing, padding, each device call), the batch whole last."""
        from ..metrics import MODEL_LABEL, REQUESTS, handler_values

        frames = [
            self._answer_frame(w, r, stages.of(w.arrived_ns) if stages and w.traced else None)
            for w, r in zip(batch, results, strict=True)
        ]
        if began is not None:
            served = {labels[MODEL_LABEL]: int(v) for name, v, labels in metrics
                      if name == REQUESTS.name}  # fmt: skip
            handler_ms = (time.monotonic() - began) * 1000
            metrics.extend(
                [m.name, v, labels] for m, v, labels in handler_values(handler_ms, served)
            )
        if metrics:
            frames.append(frame({"id": 0, "op": "metrics", "values": metrics}))
        return frames

    def _answer_frame(
        self, waiting: Waiting, result: Any, stages: list[Stage] | None = None
    ) -> bytes:
        traced = {"stages": stages} if stages else {}
        try:
            if isinstance(result, RequestError):
                raise result
            ok = {"id": waiting.id, "status": 200, "tokens": waiting.request.tokens, **traced}
            return answer(ok, result)
        except Exception as e:  # noqa: BLE001 - this request fails, the others do not
            error = e if isinstance(e, RequestError) else internal_error("building the answer")
            head: dict[str, Any] = {"id": waiting.id, "status": error.status}
            head.update(error=error.message, **traced)
            return frame({**head, "kind": error.kind} if error.kind else head)

    def _send(self, batch: list[Waiting], frames: list[bytes], number: int) -> None:
        """A batch's answers, sent on the thread that made them, in one write per
        connection (the front's one connection usually holds the whole batch: a write a
        request cost a syscall and a wake-up of the front each). Its slot is freed
        first, then the loop is woken only if requests wait for it: the loop queues a
        request before it looks for a slot, so one of the two sees the other."""
        self.started.pop(number, None)
        if self.queue:
            self.loop.call_soon_threadsafe(self.wake.set)
        by_connection: dict[Connection, list[bytes]] = {}
        for waiting, data in zip(batch, frames, strict=False):
            by_connection.setdefault(waiting.connection, []).append(data)
        # the metrics, after the answers on the first request's connection
        by_connection[batch[0].connection].extend(frames[len(batch) :])
        for connection, joined in by_connection.items():
            connection.send(joined[0] if len(joined) == 1 else b"".join(joined))


def _request(task: Task, head: dict[str, Any], body: memoryview) -> TaskRequest:
    """A request frame as the front parsed it: its texts (a pair as a list of two), or
    an image task's images (the body, cut at the sizes the head gives), the task's own
    parameters and the truncation it asked for, taken as they are."""
    from ..tasks.base import TaskRequest

    params = head.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError('"parameters" must be an object')
    if task.images:
        sizes = head.get("images")
        if not isinstance(sizes, list) or not sizes or sum(sizes) != len(body):
            raise RequestError("an image request's sizes do not match its body")
        images: list[str | tuple[str, str] | bytes] = []
        at = 0
        for n in sizes:
            images.append(bytes(body[at : at + n]))
            at += n
        return TaskRequest(texts=images, single=False, parameters=params)
    texts = head.get("texts")
    if not isinstance(texts, list) or not texts:
        raise RequestError("send at least one text")
    return TaskRequest(
        texts=[t if isinstance(t, str) else _pair(t) for t in texts],
        single=False,
        parameters=params,
        truncate=head.get("truncate"),
        truncation_direction=head.get("direction") or "right",
    )


def _pair(text: Any) -> tuple[str, str]:
    if isinstance(text, list) and len(text) == 2 and all(isinstance(x, str) for x in text):
        return text[0], text[1]
    raise RequestError("a text must be a text or a pair of texts")


def depth(settings: WorkerSettings) -> int:
    """Batches a worker holds at once: on a NeuronCore those the settings give (the
    device runs one while the host prepares the next), on the CPU one (the same cores
    run the model)."""
    return settings.batches_in_flight if settings.core_kind == "neuron" else 1


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: python -m {__name__} MODEL_DIR SOCKET INDEX", file=sys.stderr)
        return 2
    model_dir, socket_path, index = Path(argv[0]), Path(argv[1]), int(argv[2])
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s worker {index} (pid %(process)d) %(message)s",
    )
    from ..worker import FAILURE_MARKER, start_worker
    from .store import read_deployment

    settings, _, policy = read_deployment(model_dir)
    # the front checked each request against the limits before it was sent: a worker
    # bounds only what it alone sees, the answer's size from the request's tokens
    checked = {"max_client_batch": None, "max_text_chars": None, "max_request_chars": None}
    settings = settings.model_copy(update=checked)
    try:
        worker = start_worker(settings, model_dir, owner=f"worker {index}", prefer=index)
    except Exception as e:  # noqa: BLE001 - said once, in the log the supervisor reads
        print(f"{FAILURE_MARKER} {e}", file=sys.stderr, flush=True)
        return 3
    log.info("%s", worker.describe())
    try:
        import uvloop  # the front's loop too (uvicorn[standard]): a frame's hop costs less

        uvloop.run(Served(worker, depth(settings), policy).serve(socket_path))
    finally:
        worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
