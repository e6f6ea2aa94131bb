"""Demo client: talk to the front that `neuronserve serve front` started, the way clients
do, and print what a user wants to see: answers, worker placement, latency and
throughput, and which buckets served them."""

from __future__ import annotations

import argparse
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

from neuronserve.serve.deployment import running_engine
from neuronserve.serve.front.server import ENGINE_DIR

SENTENCES = [
    "How do I reset my password?",
    "I forgot my login credentials and cannot sign in.",
    "What time does the store open on Sundays?",
    "The weather in Lisbon is sunny today.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True, help="the front, e.g. http://127.0.0.1:3000")
    ap.add_argument("--run-dir", required=True, type=Path, help="the front's run directory")
    ap.add_argument("--model", default="minilm")
    args = ap.parse_args()
    session = requests.Session()

    def post(path, body):
        t0 = time.perf_counter()
        r = session.post(f"{args.url}{path}", json=body, timeout=60)
        return r, (time.perf_counter() - t0) * 1e3

    show_openai(args.url, args.model)
    show_tei(post, args.url)
    show_workers(args.run_dir, args.model)
    show_latency(post)
    show_buckets(args.url)


def show_openai(url: str, model: str) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused on loopback")
    got = client.embeddings.create(model=model, input="hello world")
    emb = got.data[0].embedding
    print(f"openai client: embeddings.create(input='hello world') at {url}/v1")
    print(
        f"  -> a {len(emb)}-dim embedding [{', '.join(f'{x:.4f}' for x in emb[:4])}, ...], "
        f"norm {np.linalg.norm(emb):.4f}, usage {got.usage.prompt_tokens} tokens"
    )


def show_tei(post, url: str) -> None:
    r, _ = post("/embed", {"inputs": SENTENCES})
    vecs = np.array(r.json())
    sims = vecs @ vecs.T
    print(f"\nPOST {url}/embed (text-embeddings-inference), four texts; cosine similarity:")
    for i, s in enumerate(SENTENCES):
        row = "  ".join(f"{sims[i, j]:.2f}" for j in range(len(SENTENCES)))
        print(f"  {row}   {s}")
    bad, _ = post("/embed", {"inputs": 42})
    print(f'\na bad request {{"inputs": 42}} -> {bad.status_code} {bad.json()["error"]!r}')


def show_workers(run_dir: Path, model: str) -> None:
    engine = running_engine(run_dir / ENGINE_DIR, "torchserve")
    print("\nTorchServe's workers behind the front (its management API on loopback, /proc):")
    for w in engine.instance.workers(model):
        pid = int(w["pid"])
        status = Path(f"/proc/{pid}/status").read_text()
        cpus = re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)
        print(f"  pid {pid}: {w['status']}, pinned to CPU {cpus}")


def show_latency(post) -> None:
    # TorchServe's Java frontend compiles its hot paths during the first seconds of
    # traffic, when a request costs it more CPU than it will once warm
    warm_until = time.perf_counter() + 3
    while time.perf_counter() < warm_until:
        post("/embed", {"inputs": SENTENCES[0]})
    lat = [post("/embed", {"inputs": SENTENCES[i % 4]})[1] for i in range(100)]
    q = statistics.quantiles(lat, n=100)
    print(
        f"\nsequential, 1 text per request: p50 {q[49]:.1f} ms, p95 {q[94]:.1f} ms "
        f"({len(lat)} requests after 3 s of warm-up, client round trip through the front)"
    )
    n, conc = 400, 16
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        lat = list(pool.map(lambda i: post("/embed", {"inputs": SENTENCES[i % 4]})[1], range(n)))
    wall = time.perf_counter() - t0
    q = statistics.quantiles(lat, n=100)
    print(
        f"{conc} concurrent clients: {n / wall:.0f} req/s, p50 {q[49]:.1f} ms, "
        f"p95 {q[94]:.1f} ms (TorchServe batches them)"
    )


def show_buckets(url: str) -> None:
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    runs = re.findall(
        r'NeuronServeBucketRuns\{[^}]*Bucket="(\w+)",BatchSize="(\d+)"[^}]*\} (\S+)', metrics
    )
    if runs:
        shown = ", ".join(
            f"{b} x{int(float(c))} (batch {s})"
            for b, s, c in sorted(runs, key=lambda x: -float(x[2]))[:5]
        )
        print(f"most used buckets ({url}/metrics, the engine's NeuronServeBucketRuns): {shown}")
    served = re.findall(
        r'neuronserve_front_requests_total\{route="/embed",status="200"\} (\S+)', metrics
    )
    if served:
        print(f"the front's own count: {int(float(served[0]))} answered on /embed")


if __name__ == "__main__":
    main()
