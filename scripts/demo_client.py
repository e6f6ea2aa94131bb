"""Demo client: talk to the TorchServe that `neuronserve serve torchserve` started and
print what a user wants to see: results, worker placement, latency and throughput."""

from __future__ import annotations

import argparse
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

from neuronserve.serve.torchserve import running

SENTENCES = [
    "How do I reset my password?",
    "I forgot my login credentials and cannot sign in.",
    "What time does the store open on Sundays?",
    "The weather in Lisbon is sunny today.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--model", default="minilm")
    args = ap.parse_args()
    inst = running(args.run_dir)
    if inst is None:
        raise SystemExit(f"no TorchServe running from {args.run_dir}")
    url = f"{inst.inference_url}/predictions/{args.model}"
    headers = {**inst.headers(), "Content-Type": "application/json"}

    def post(body):
        t0 = time.perf_counter()
        r = requests.post(url, json=body, headers=headers, timeout=60)
        return r, (time.perf_counter() - t0) * 1e3

    print(f"POST {url}  (Authorization: Bearer <inference key>)")
    show_answers(post)
    show_workers(inst, args.model)
    show_latency(post)
    show_buckets(inst)


def show_answers(post) -> None:
    r, _ = post({"inputs": "hello world"})
    emb = r.json()
    print(
        f'  {{"inputs": "hello world"}} -> {r.status_code}, a {len(emb)}-dim embedding '
        f"[{', '.join(f'{x:.4f}' for x in emb[:4])}, ...], norm {np.linalg.norm(emb):.4f}"
    )
    vecs = np.array(post({"inputs": SENTENCES})[0].json())
    sims = vecs @ vecs.T
    print("\ncosine similarity (one request, four texts):")
    for i, s in enumerate(SENTENCES):
        row = "  ".join(f"{sims[i, j]:.2f}" for j in range(len(SENTENCES)))
        print(f"  {row}   {s}")
    bad, _ = post({"inputs": 42})
    print(f'\na bad request {{"inputs": 42}} -> {bad.status_code} {bad.json()["error"]!r}')


def show_workers(inst, model: str) -> None:
    print("\nworkers (read from the management API and /proc):")
    for w in inst.workers(model):
        pid = int(w["pid"])
        status = Path(f"/proc/{pid}/status").read_text()
        cpus = re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)
        print(f"  pid {pid}: {w['status']}, pinned to CPU {cpus}")


def show_latency(post) -> None:
    for _ in range(10):
        post({"inputs": SENTENCES[0]})
    lat = [post({"inputs": SENTENCES[i % 4]})[1] for i in range(100)]
    q = statistics.quantiles(lat, n=100)
    print(
        f"\nsequential, 1 text per request: p50 {q[49]:.1f} ms, p95 {q[94]:.1f} ms "
        f"({len(lat)} requests, client round trip)"
    )
    n, conc = 400, 16
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        lat = list(pool.map(lambda i: post({"inputs": SENTENCES[i % 4]})[1], range(n)))
    wall = time.perf_counter() - t0
    q = statistics.quantiles(lat, n=100)
    print(
        f"{conc} concurrent clients: {n / wall:.0f} req/s, p50 {q[49]:.1f} ms, "
        f"p95 {q[94]:.1f} ms (TorchServe batches them)"
    )


def show_buckets(inst) -> None:
    metrics = requests.get(f"{inst.metrics_url}/metrics", timeout=10).text
    runs = re.findall(
        r'NeuronServeBucketRuns\{[^}]*Bucket="(\w+)",BatchSize="(\d+)"[^}]*\} (\S+)', metrics
    )
    if runs:
        shown = ", ".join(
            f"{b} x{int(float(c))} (batch {s})"
            for b, s, c in sorted(runs, key=lambda x: -float(x[2]))[:5]
        )
        print(f"most used buckets ({inst.metrics_url}/metrics, NeuronServeBucketRuns): {shown}")


if __name__ == "__main__":
    main()
