"""Two models on the same workers: how long model B's requests take alone, and while
model A is driven by 16 concurrent clients, through the front, on each engine.

    python scripts/benchmark_models.py --a ARTIFACT_A --b ARTIFACT_B --out DIR [--runs 3]

For each engine and run: start `serve front` with both models (every worker holds both),
warm up, send B one request at a time for `--seconds` (B alone), then start A's 16
clients in a process of their own (aiohttp on one event loop, its CPU time recorded) and
send B one request at a time again for as long (B beside A's flood). Writes results.json
and summary.md (median and range over the runs) to DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests

TEXT_A = "How do I reset my password if the confirmation email never arrives?"
TEXT_B = "My card was charged twice this month"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_run(engine: str, a: Path, b: Path, seconds: float, log) -> dict:
    from neuronserve.processes import free_ports
    from neuronserve.serve.front import launch
    from neuronserve.spec import load_spec

    with tempfile.TemporaryDirectory(prefix="ns-models-") as tmp:
        port = free_ports(1)[0]
        spec = load_spec(
            None,
            {
                "front": {
                    "engine": engine,
                    "port": port,
                    "run_dir": Path(tmp) / "front",
                    "max_in_flight": 10_000,
                }
            },
        )
        base = f"http://127.0.0.1:{port}"
        launch.start(spec, [a, b], log=lambda _: None)
        try:
            name_a = requests.get(f"{base}/info", timeout=10).json()["models"][0]["model_id"]
            name_b = requests.get(f"{base}/info", timeout=10).json()["models"][1]["model_id"]
            url = f"{base}/invocations"
            body_a, body_b = {"inputs": TEXT_A}, {"inputs": TEXT_B}

            # warm-up: both models, sequential and concurrent
            sequential_headers(url, body_a, name_a, 3)
            sequential_headers(url, body_b, name_b, 3)
            alone = sequential_headers(url, body_b, name_b, seconds)
            stop, counts = mp.Event(), mp.Queue()
            flooder = mp.Process(target=flood_named, args=((url, body_a, name_a), 16, stop, counts))
            flooder.start()
            time.sleep(2)  # A's clients at full speed before B is measured
            t0 = time.monotonic()
            beside = sequential_headers(url, body_b, name_b, seconds)
            stop.set()
            a_done, a_failed, a_cpu = counts.get(timeout=120)
            flooder.join(60)
            wall = time.monotonic() - t0 + 2
        finally:
            launch.stop(spec.front.run_dir, log=lambda _: None)
    row = {
        "engine": engine,
        "model_a": name_a,
        "model_b": name_b,
        "b_alone": summary(alone),
        "b_beside_a": summary(beside),
        "a_req_per_s": a_done / wall,
        "a_failed": a_failed,
        "load_generator_cores": a_cpu / wall,
    }
    log(json.dumps(row))
    return row


def sequential_headers(url: str, body: dict, model: str, seconds: float) -> list[float]:
    session, out = requests.Session(), []
    session.headers["X-Amzn-SageMaker-Target-Model"] = model
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        r = session.post(url, json=body, timeout=60)
        r.raise_for_status()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def flood_named(target: tuple[str, dict, str], clients: int, stop: Any, counts: Any) -> None:
    """`clients` closed-loop clients of `target` (url, body, model) on one event loop until
    `stop`; puts (requests, failures, CPU seconds of this process)."""
    import os

    import aiohttp

    url, body, model = target

    async def main() -> tuple[int, int]:
        done = failed = 0
        headers = {"X-Amzn-SageMaker-Target-Model": model}
        async with aiohttp.ClientSession(headers=headers) as session:

            async def client() -> None:
                nonlocal done, failed
                while not stop.is_set():
                    async with session.post(url, json=body) as r:
                        await r.read()
                        done, failed = done + (r.status == 200), failed + (r.status != 200)

            await asyncio.gather(*(client() for _ in range(clients)))
        return done, failed

    t0 = os.times()
    done, failed = asyncio.run(main())
    t1 = os.times()
    counts.put((done, failed, (t1.user - t0.user) + (t1.system - t0.system)))


def summary(latencies: list[float]) -> dict:
    return {
        "requests": len(latencies),
        "p50_ms": round(statistics.median(latencies), 2),
        "p95_ms": round(percentile(latencies, 0.95), 2),
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def report(rows: list[dict]) -> str:
    lines = [
        "| engine | B alone p50 | B alone p95 | B beside A p50 | B beside A p95 "
        "| p95 beside / alone | A req/s | load generator cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for engine in dict.fromkeys(r["engine"] for r in rows):
        mine = [r for r in rows if r["engine"] == engine]

        def col(key: str, field: str, rs=mine) -> list[float]:
            return [r[key][field] for r in rs]

        ratio = [r["b_beside_a"]["p95_ms"] / r["b_alone"]["p95_ms"] for r in mine]
        lines.append(
            f"| {engine} | {spread(col('b_alone', 'p50_ms'))} | {spread(col('b_alone', 'p95_ms'))} "
            f"| {spread(col('b_beside_a', 'p50_ms'))} | {spread(col('b_beside_a', 'p95_ms'))} "
            f"| {spread(ratio)} | {spread([r['a_req_per_s'] for r in mine])} "
            f"| {spread([r['load_generator_cores'] for r in mine])} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--a", type=Path, required=True, help="artifact of model A (flooded)")
    ap.add_argument("--b", type=Path, required=True, help="artifact of model B (measured)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--engines", default="torchserve,triton")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = []

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    for run in range(args.runs):
        for engine in args.engines.split(","):
            log(f"run {run + 1}, {engine} ...")
            rows.append(one_run(engine, args.a, args.b, args.seconds, log))
    machine = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "started": started,
    }
    (args.out / "results.json").write_text(json.dumps({"machine": machine, "runs": rows}, indent=2))
    text = (
        f"Two models on the same workers, through the front (started {started}; "
        f"{args.runs} runs, median (min-max); B one request at a time for {args.seconds:.0f} s, "
        f"alone and while A's 16 clients run in a process of their own)\n\n{report(rows)}\n"
    )
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
