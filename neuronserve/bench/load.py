"""Closed-loop load: `concurrency` clients, each sending its next request as soon as
the previous one is answered, on its own keep-alive connection. HTTP endpoints run
every client on one asyncio event loop (one thread, like wrk); the others (gRPC,
in-process) on one thread per client.

Only requests started inside the measuring window count, so warm-up and the tail of
requests in flight when the window opens are left out. The generator's own CPU time
over the window is reported: on a 2-core machine the client competes with the server,
and a number measured by a saturated client would be the client's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .endpoints import Endpoint, RequestFailed


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


def run_load(endpoint: Endpoint, payload: Any, concurrency: int, warmup_s: float,
             duration_s: float, min_requests: int, max_duration_s: float,
             probe: Callable[[], Any] | None = None) -> LoadResult:
    """Warm up for `warmup_s`, then measure for at least `duration_s` and `min_requests`
    completed requests (giving up on the count after `max_duration_s`). `probe` (server
    counters, CPU times) is called as the window opens and as it closes."""
    measuring = threading.Event()
    stop = threading.Event()
    lock = threading.Lock()
    latencies: list[float] = []
    ends: list[float] = []
    errors: list[str] = []
    failures: list[BaseException] = []
    use_async = getattr(endpoint, "async_connect", None) is not None
    ready = threading.Barrier(2 if use_async else concurrency + 1)

    def record(counted: bool, ok: bool, err: str, t0: float, t1: float) -> None:
        if counted and not stop.is_set():
            with lock:
                if ok:
                    latencies.append((t1 - t0) * 1e3)
                    ends.append(t1)
                else:
                    errors.append(err)

    def worker() -> None:
        try:
            send = endpoint.connect()
        except BaseException as e:  # noqa: BLE001 - reported by the coordinator
            failures.append(e)
            ready.abort()
            return
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            return
        while not stop.is_set():
            counted, err = measuring.is_set(), ""
            t0 = time.perf_counter()
            try:
                send(payload)
                ok = True
            except RequestFailed as e:
                ok, err = False, str(e)
            record(counted, ok, err, t0, time.perf_counter())

    async def client(send) -> None:
        while not stop.is_set():
            counted, err = measuring.is_set(), ""
            t0 = time.perf_counter()
            try:
                await send(payload)
                ok = True
            except RequestFailed as e:
                ok, err = False, str(e)
            record(counted, ok, err, t0, time.perf_counter())

    def event_loop() -> None:
        # every connection on one thread, like wrk (see AsyncHttpConnection)
        async def main() -> None:
            sends = [endpoint.async_connect() for _ in range(concurrency)]
            try:
                ready.wait()
            except threading.BrokenBarrierError:
                return
            await asyncio.gather(*(client(s) for s in sends))

        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - reported by the coordinator
            failures.append(e)
            ready.abort()

    if use_async:
        threads = [threading.Thread(target=event_loop, daemon=True)]
    else:
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        stop.set()
        raise RuntimeError(f"{endpoint.label}: cannot connect: {failures[0]}") from failures[0]
    time.sleep(warmup_s)
    probe_start = probe() if probe else None
    cpu0, t_start = time.process_time(), time.perf_counter()
    measuring.set()
    while True:
        time.sleep(0.05)
        elapsed = time.perf_counter() - t_start
        with lock:
            done = len(latencies) + len(errors)
        if (elapsed >= duration_s and done >= min_requests) or elapsed >= max_duration_s:
            break
    # the window closes now; requests still in flight are not counted
    with lock:
        stop.set()
        t_end = time.perf_counter()
        cpu = time.process_time() - cpu0
        lat, end, errs = list(latencies), list(ends), list(errors)
    probe_end = probe() if probe else None
    for t in threads:
        t.join(timeout=600)
    wall = (max(end) if end else t_end) - t_start
    return LoadResult(lat, max(wall, 1e-9), len(errs), cpu, errs[:3], probe_start, probe_end)
