"""The summary of `scripts/benchmark_inferentia_sim.sh`: per endpoint and revision, the
best req/s over the concurrencies measured and its share of the chip's published
batched limit, the lone request's p50 beside the device's own time, the NeuronCore's
utilization and the host's CPU per request at the best point, and the errors at any
concurrency; median (min-max) over the rounds.

    .venv/bin/python scripts/inferentia_sim_summary.py benchmarks/inferentia-sim "<new>" "<base>"
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from spread import spread

# bert-base on inf2.xlarge, sequence 128, batch 8: 2,674 inferences/s over the chip's two
# NeuronCores (AWS's Inf2 performance tables), so per NeuronCore
CHIP_PER_CORE = 2674 / 2
# the device's own time for one text at batch 1 (the same tables' p50)
DEVICE_MS = 1.00
CPU = ("workers", "front", "client")


def rounds(out: Path, who: str) -> list[list[dict[str, Any]]]:
    runs = sorted(out.glob(f"{who}-*"), key=lambda d: int(d.name.split("-")[1]))
    return [json.loads((d / "results.json").read_text())["points"] for d in runs]


def per_endpoint(points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for p in points:
        e = out.setdefault(p["endpoint"], {"best": None, "lone": None, "errors": 0})
        e["errors"] += p.get("errors") or 0
        if p["concurrency"] == 1:
            e["lone"] = p["p50_ms"]
        if not p.get("errors") and (e["best"] is None or p["req_per_s"] > e["best"]["req_per_s"]):
            e["best"] = p
    return out


def row(endpoint: str, label: str, found: list[dict[str, Any]]) -> str | None:
    """One endpoint's line over the rounds (None: no round measured it)."""
    here = [r[endpoint] for r in found if endpoint in r and r[endpoint]["best"]]
    if not here:
        return None
    best = [e["best"] for e in here]
    conc = sorted({b["concurrency"] for b in best})
    busy = [b["neuroncore_busy"] * 100 for b in best if "neuroncore_busy" in b]
    cpu = [sum(b.get(f"cpu_ms_per_req_{k}") or 0.0 for k in CPU) for b in best]
    lone = [e["lone"] for e in here if e["lone"] is not None]
    return (
        f"| {endpoint} | {label} | {spread([b['req_per_s'] for b in best], 0)} "
        f"[c{'/'.join(map(str, conc))}] | "
        f"{spread([b['req_per_s'] / CHIP_PER_CORE for b in best], 2)} | "
        f"{spread(lone, 1) if lone else ''} | "
        f"{spread(busy, 0) + '%' if busy else ''} | {spread(cpu, 2)} | "
        f"{sum(e['errors'] for e in here)} |"
    )


def main(out: Path, new_label: str, base_label: str) -> str:
    lines = [
        f"## {new_label} against {base_label} on the simulated inf2 NeuronCore",
        "",
        f"Best req/s over the concurrencies measured (in brackets), its share of the chip's "
        f"batched limit ({CHIP_PER_CORE:.0f}/s per NeuronCore), the lone request's p50 (the "
        f"device's own time: {DEVICE_MS:.2f} ms), the NeuronCore's utilization and the "
        "CPU ms per request of every process at the best point, and errors (non-2xx) over "
        "all points; median (min-max) over the rounds.",
        "",
        "| endpoint | revision | best req/s | of the chip | lone p50 ms | NeuronCore busy "
        "| CPU ms/req | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    runs = {label: [per_endpoint(r) for r in rounds(out, who)]
            for who, label in (("base", base_label), ("new", new_label))}  # fmt: skip
    endpoints = sorted({e for found in runs.values() for r in found for e in r})
    for endpoint in endpoints:
        lines += [line for label, found in runs.items() if (line := row(endpoint, label, found))]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]), end="")
