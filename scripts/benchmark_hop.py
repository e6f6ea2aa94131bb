"""What one hop between the front and a native worker costs, by event loop: a client
process sends a request frame (one 128-token text, as the front's client writes it) over
a unix socket to an echo process that answers with an embedding's frame (768 float32,
as a worker's answer carries it), both on the native engine's wire
(neuronserve.workers.wire), one request at a time. Each round runs both loops,
asyncio's own and uvloop, in alternating order; the round trip's median per loop, and
uvloop's as a share of asyncio's, round by round.

    .venv/bin/python scripts/benchmark_hop.py [ROUNDS] [REQUESTS]
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from spread import spread

from neuronserve.waiting import until
from neuronserve.workers.wire import MAX_ANSWER_BYTES, MAX_REQUEST_BYTES, answer, frame, read_frame

LOOPS = ("asyncio", "uvloop")


def _run(loop: str, main: object) -> object:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)  # type: ignore[arg-type]
    return asyncio.run(main)  # type: ignore[arg-type]


async def _echo(path: str) -> None:
    rows = np.ones((1, 768), np.float32)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (got := await read_frame(reader, MAX_REQUEST_BYTES)) is not None:
            writer.write(answer({"id": got[0]["id"], "status": 200}, rows))

    server = await asyncio.start_unix_server(echo, path)
    async with server:
        await server.serve_forever()


async def _client(path: str, n: int) -> list[float]:
    reader, writer = await asyncio.open_unix_connection(path)
    took = []
    for i in range(n):
        start = time.perf_counter()
        writer.write(frame({"op": "infer", "id": i, "model": "m", "texts": ["word " * 120]}))
        await read_frame(reader, MAX_ANSWER_BYTES)
        took.append(time.perf_counter() - start)
    writer.close()
    return took[n // 10 :]  # the first tenth warms up


def round_trip_us(loop: str, n: int) -> float:
    """The median round trip in microseconds, both processes on `loop`."""
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "hop.sock")
        echo = subprocess.Popen([sys.executable, __file__, "--echo", loop, path])
        try:
            if not until(lambda: Path(path).exists() or echo.poll() is not None, 30):
                raise SystemExit("the echo process never opened its socket")
            if echo.poll() is not None:
                raise SystemExit(f"the echo process exited ({echo.returncode})")
            took = _run(loop, _client(path, n))
        finally:
            echo.terminate()
            echo.wait()
    return statistics.median(took) * 1e6  # type: ignore[arg-type]


def main() -> None:
    if sys.argv[1:2] == ["--echo"]:
        _run(sys.argv[2], _echo(sys.argv[3]))
        return
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    print("| round | asyncio us | uvloop us | uvloop / asyncio |\n|---|---:|---:|---:|")
    ratios = []
    for r in range(1, rounds + 1):
        order = LOOPS if r % 2 else LOOPS[::-1]
        got = {loop: round_trip_us(loop, n) for loop in order}
        ratios.append(got["uvloop"] / got["asyncio"])
        print(f"| {r} | {got['asyncio']:.0f} | {got['uvloop']:.0f} | {ratios[-1]:.2f} |")
    print(f"\nuvloop / asyncio, median (range) over {rounds} rounds: {spread(ratios, 2)}")


if __name__ == "__main__":
    main()
