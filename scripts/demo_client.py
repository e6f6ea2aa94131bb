"""Demo client: talk to the front that `neuronserve serve front` started for the demo's
three models (embeddings, a reranker, a classifier), the way clients do, and print what a
user wants to see: one answer from each model, worker placement, latency and throughput,
and which buckets served them."""

from __future__ import annotations

import argparse
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

from neuronserve.serve.deployment import running_workers
from neuronserve.serve.front.launch import WORKERS_DIR

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
    args = ap.parse_args()
    session = requests.Session()

    def post(path, body):
        t0 = time.perf_counter()
        r = session.post(f"{args.url}{path}", json=body, timeout=60)
        return r, (time.perf_counter() - t0) * 1e3

    show_openai(args.url, "minilm")
    show_tei(post, args.url)
    show_rerank(post, args.url)
    show_topics(post, args.url)
    show_workers(args.run_dir)
    show_latency(post)
    show_buckets(args.url)


def show_rerank(post, url: str) -> None:
    docs = [
        "Our stores open at nine on Sundays.",
        "Open settings, choose Security and press Reset password.",
        "Refunds reach your card within five days.",
    ]
    query = "I can't log in, how do I change my password?"
    r, _ = post("/rerank", {"query": query, "texts": docs, "return_text": True})
    print(f"\nPOST {url}/rerank (the cross-encoder): {query!r}")
    for hit in r.json():
        print(f"  {hit['score']:.3f}  {hit['text']}")


def show_topics(post, url: str) -> None:
    tickets = [
        "My card was charged twice this month",
        "The courier left the box in the rain",
        "I cannot sign in since yesterday",
    ]
    r, _ = post("/predict", {"inputs": tickets, "model": "topics"})
    print(f"\nPOST {url}/predict (the classifier), three support tickets:")
    for text, labels in zip(tickets, r.json(), strict=True):
        best = max(labels, key=lambda x: x["score"])
        print(f"  {best['label']:<9} {best['score']:.2f}  {text}")


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


def show_workers(run_dir: Path) -> None:
    workers = running_workers(run_dir / WORKERS_DIR)
    assert workers is not None, "the front's workers are not running"
    print("\nthe workers behind the front, one process each, every one holding all three")
    print("models (/proc):")
    for w in sorted(workers.states(), key=lambda w: w["index"]):
        status = Path(f"/proc/{w['pid']}/status").read_text()
        cpus = re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)
        print(f"  pid {w['pid']}: worker {w['index']}, pinned to CPU {cpus}")


def show_latency(post) -> None:
    # the first requests pay one-off costs (connections, each bucket's first call)
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
        f"p95 {q[94]:.1f} ms (the front joins those that arrive together into batches)"
    )


def show_buckets(url: str) -> None:
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    # one series per instance: summed by bucket and rows in it
    runs: dict[tuple[str, str], float] = {}
    series = r"^neuronserve_bucket_runs_total\{([^}]*)\} (\S+)$"
    for labels, count in re.findall(series, metrics, re.M):
        label = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if label.get("model") == "minilm":
            key = (label["bucket"], label["batch_size"])
            runs[key] = runs.get(key, 0.0) + float(count)
    if runs:
        shown = ", ".join(
            f"{b} x{int(c)} (batch {s})"
            for (b, s), c in sorted(runs.items(), key=lambda x: -x[1])[:5]
        )
        print(f"minilm's most used buckets ({url}/metrics, neuronserve_bucket_runs): {shown}")
    served = re.findall(
        r'neuronserve_front_requests_total\{model="minilm",route="/embed",status="200"\} (\S+)',
        metrics,
    )
    if served:
        print(f"the front's own count: {int(float(served[0]))} answered on /embed")


if __name__ == "__main__":
    main()
