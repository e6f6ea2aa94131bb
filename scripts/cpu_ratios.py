"""The summary of `scripts/benchmark_cpu_ratios.sh`: for each model and length, our
server's best req/s for requests of one text against infinity-emb's optimum engine, and its
best texts/s for requests of 32 texts against the offline reference (the artifact's own
OpenVINO model in process, batches of 32). Bests are over the concurrencies run; ratios
are taken round by round, then given as median (min-max) over the rounds.

    .venv/bin/python scripts/cpu_ratios.py benchmarks/cpu-ratios-one-and-32-texts
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from spread import spread

ROUTES = ("/v1/embeddings", "/embed", "/invocations")
PEER = "infinity-optimum"
# what the ratios are held to
PEER_TARGET, OFFLINE_TARGET = 3.0, 0.95

Points = list[dict[str, Any]]


def points(path: Path) -> Points:
    return list(json.loads(path.read_text())["points"])


def best(found: Points, label: str, seq: int, texts: int, key: str) -> dict[str, Any] | None:
    rows = [
        p
        for p in found
        if p["endpoint"].endswith(label) and p["seq"] == seq and p["texts"] == texts
        if p.get(key) and not p.get("errors")
    ]
    return max(rows, key=lambda p: p[key]) if rows else None


def cell(values: list[float], digits: int) -> str:
    return spread(values, digits) or "-"


def model_rows(folder: Path) -> list[str]:
    runs = sorted(p for p in folder.glob("run*") if (p / "offline.json").is_file())
    if not runs:
        return []
    data = [
        (
            points(r / "front" / "results.json") + points(r / "front-32" / "results.json"),
            points(r / "peer" / "results.json"),
            json.loads((r / "offline.json").read_text()),
        )
        for r in runs
    ]
    seqs = sorted({p["seq"] for ours, _, _ in data for p in ours})
    out = []
    for seq in seqs:
        for route in ROUTES:
            ours, peer, ratio, at = [], [], [], []
            for mine, theirs, _ in data:
                a = best(mine, route, seq, 1, "req_per_s")
                b = best(theirs, PEER, seq, 1, "req_per_s")
                if a and b:
                    ours.append(a["req_per_s"])
                    peer.append(b["req_per_s"])
                    ratio.append(a["req_per_s"] / b["req_per_s"])
                    at.append(f"c{a['concurrency']}/c{b['concurrency']}")
            bulk, ref, bulk_ratio, bulk_at = [], [], [], []
            for mine, _, offline in data:
                a = best(mine, route, seq, 32, "texts_per_s")
                o = offline.get(str(seq), {}).get("texts_per_s")
                if a and o:
                    bulk.append(a["texts_per_s"])
                    ref.append(o)
                    bulk_ratio.append(a["texts_per_s"] / o)
                    bulk_at.append(f"c{a['concurrency']}")
            out.append(
                f"| {folder.name} | {seq} | {route} | {cell(ours, 0)} | {cell(peer, 0)} | "
                f"**{cell(ratio, 2)}** | {' '.join(at)} | {cell(bulk, 0)} | {cell(ref, 0)} | "
                f"**{cell(bulk_ratio, 2)}** | {' '.join(bulk_at)} |"
            )
    return out


def main(root: Path) -> None:
    rows = [
        r for folder in sorted(p for p in root.iterdir() if p.is_dir()) for r in model_rows(folder)
    ]
    print(
        "Ratios round by round, median (min-max) over the rounds; bests over 1, 8 and 32\n"
        "clients for one text, 1, 2 and 4 for 32 texts (at: the concurrency of each round's\n"
        "best, ours/the peer's). Held to: one text, "
        f"at least {PEER_TARGET:g}x the peer; 32 texts, at least {OFFLINE_TARGET:g} of the"
        " offline reference.\n"
    )
    print(
        "| model | tokens | route | one text: ours, req/s | infinity-emb optimum, req/s | "
        "ours / peer | at | 32 texts: ours, texts/s | offline reference, texts/s | "
        "ours / offline | at |"
    )
    print("|---|---:|---|---:|---:|---:|---|---:|---:|---:|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("benchmarks/cpu-ratios-one-and-32-texts"))
