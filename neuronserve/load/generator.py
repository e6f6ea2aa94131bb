"""Closed-loop load: `concurrency` clients, each sending its next request as soon as
the previous one is answered, on its own keep-alive connection. HTTP endpoints run
every client on one asyncio event loop (one thread, like wrk); the others (gRPC,
in-process) on one thread per client, except a lone in-process client, which runs on
the calling thread (see _run_on_this_thread).

Only requests started inside the measuring window count, so warm-up and the tail of
requests in flight when the window opens are left out. The generator's own CPU time
over the window is reported: on a 2-core machine the client competes with the server,
and a number measured by a saturated client would be the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .endpoints import Endpoint, RequestFailed


@dataclass(frozen=True)
class Window:
    """How long one point is measured: warm up for `warmup_s`, then measure for at least
    `duration_s` and `min_requests` completed requests (giving up on the count after
    `max_duration_s`)."""

    warmup_s: float = 2.0
    duration_s: float = 5.0
    min_requests: int = 20
    max_duration_s: float = 60.0

    def over(self, elapsed_s: float, done: int) -> bool:
        """Whether a window open for `elapsed_s` with `done` requests completed is over."""
        enough = elapsed_s >= self.duration_s and done >= self.min_requests
        return enough or elapsed_s >= self.max_duration_s


@dataclass
class LoadResult:
    latencies_ms: list[float]
    wall_s: float
    errors: int
    client_cpu_s: float
    error_samples: list[str] = field(default_factory=list)
    # what `probe` returned as the window opened and as it closed
    probe_start: Any = None
    probe_end: Any = None

    @property
    def client_cores(self) -> float:
        """CPU cores the load generator kept busy on average (1.0 = one whole core)."""
        return self.client_cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class _Load:
    """The clients of one point and what they record."""

    def __init__(self, endpoint: Endpoint, payload: Any, concurrency: int):
        self.endpoint, self.payload, self.concurrency = endpoint, payload, concurrency
        self.measuring, self.stop = threading.Event(), threading.Event()
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.ends: list[float] = []
        self.errors: list[str] = []
        self.failures: list[BaseException] = []
        self.use_async = getattr(endpoint, "async_connect", None) is not None
        self.ready = threading.Barrier(2 if self.use_async else concurrency + 1)

    def done(self) -> int:
        with self.lock:
            return len(self.latencies) + len(self.errors)

    def _record(self, counted: bool, err: str | None, t0: float, t1: float) -> None:
        if counted and not self.stop.is_set():
            with self.lock:
                if err is None:
                    self.latencies.append((t1 - t0) * 1e3)
                    self.ends.append(t1)
                else:
                    self.errors.append(err)

    def _fail(self, e: BaseException) -> None:
        self.failures.append(e)
        self.ready.abort()

    def _wait_ready(self) -> bool:
        try:
            self.ready.wait()
        except threading.BrokenBarrierError:
            return False
        return True

    def _thread_client(self) -> None:
        try:
            send = self.endpoint.connect()
        except BaseException as e:  # noqa: BLE001 - reported by the coordinator
            self._fail(e)
            return
        if not self._wait_ready():
            return
        while not self.stop.is_set():
            counted, err, t0 = self.measuring.is_set(), None, time.perf_counter()
            try:
                send(self.payload)
            except RequestFailed as e:
                err = str(e)
            self._record(counted, err, t0, time.perf_counter())

    async def _async_client(self, send: Callable[[Any], Awaitable[None]]) -> None:
        while not self.stop.is_set():
            counted, err, t0 = self.measuring.is_set(), None, time.perf_counter()
            try:
                await send(self.payload)
            except RequestFailed as e:
                err = str(e)
            self._record(counted, err, t0, time.perf_counter())

    def _event_loop(self) -> None:
        # every connection on one thread, like wrk (see AsyncHttpConnection)
        connect = self.endpoint.async_connect
        assert connect is not None

        async def main() -> None:
            sends = [connect() for _ in range(self.concurrency)]
            if self._wait_ready():
                await asyncio.gather(*(self._async_client(s) for s in sends))

        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - reported by the coordinator
            self._fail(e)

    def start(self) -> list[threading.Thread]:
        if self.use_async:
            threads = [threading.Thread(target=self._event_loop, daemon=True)]
        else:
            threads = [
                threading.Thread(target=self._thread_client, daemon=True)
                for _ in range(self.concurrency)
            ]
        for t in threads:
            t.start()
        if not self._wait_ready():
            self.stop.set()
            raise RuntimeError(
                f"{self.endpoint.label}: cannot connect: {self.failures[0]}"
            ) from self.failures[0]
        return threads


def run_load(
    endpoint: Endpoint,
    payload: Any,
    concurrency: int,
    window: Window,
    probe: Callable[[], Any] | None = None,
) -> LoadResult:
    """One point: `concurrency` closed-loop clients sending `payload` over `window`.
    `probe` (server counters, CPU times) is called as the window opens and as it closes."""
    if endpoint.in_process and concurrency == 1:
        return _run_on_this_thread(endpoint, payload, window, probe)
    load = _Load(endpoint, payload, concurrency)
    threads = load.start()
    time.sleep(window.warmup_s)
    probe_start = probe() if probe else None
    cpu0, t_start = time.process_time(), time.perf_counter()
    load.measuring.set()
    while True:
        time.sleep(0.05)
        elapsed = time.perf_counter() - t_start
        if window.over(elapsed, load.done()):
            break
    # the window closes now; requests still in flight are not counted
    with load.lock:
        load.stop.set()
        t_end = time.perf_counter()
        cpu = time.process_time() - cpu0
        lat, end, errs = list(load.latencies), list(load.ends), list(load.errors)
    probe_end = probe() if probe else None
    for t in threads:
        t.join(timeout=600)
    wall = (max(end) if end else t_end) - t_start
    return LoadResult(lat, max(wall, 1e-9), len(errs), cpu, errs[:3], probe_start, probe_end)


def _run_on_this_thread(
    endpoint: Endpoint, payload: Any, window: Window, probe: Callable[[], Any] | None
) -> LoadResult:
    """One in-process client on the calling thread, as a user's own loop would run. torch
    runs slower from a second thread: measured here, the transformers pipeline at 16 to
    64 tokens made 0.64-0.90 of its main-thread calls per second from another thread with
    two intra-op threads, equal with one, and equal with OMP_WAIT_POLICY=PASSIVE (the main
    thread then slows to the other's): the main thread's OpenMP team wakes faster. A
    threaded client had lowered the vanilla baseline by that much."""
    send = endpoint.connect()
    warm_until = time.perf_counter() + window.warmup_s
    while time.perf_counter() < warm_until:
        with contextlib.suppress(RequestFailed):  # warm-up answers are not counted
            send(payload)
    probe_start = probe() if probe else None
    latencies: list[float] = []
    errors: list[str] = []
    cpu0 = time.process_time()
    t_start = last_end = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        try:
            send(payload)
            last_end = time.perf_counter()
            latencies.append((last_end - t0) * 1e3)
        except RequestFailed as e:
            errors.append(str(e))
        if window.over(time.perf_counter() - t_start, len(latencies) + len(errors)):
            break
    cpu = time.process_time() - cpu0
    probe_end = probe() if probe else None
    wall = max(last_end - t_start, 1e-9)
    return LoadResult(latencies, wall, len(errors), cpu, errors[:3], probe_start, probe_end)
