"""The summary of `scripts/benchmark_short.sh`'s runs: each endpoint's best req/s over
concurrency per length, the lone request, the front against its engine, TorchServe
against Triton, the best engine against the offline reference, and the load generator's
CPU share. Ratios are taken run by run, then given as median (min-max) over the runs.

    .venv/bin/python scripts/short_summary.py benchmarks/short/run*
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spread import spread

# what each row of the tables is called, and the bench endpoint label it comes from
ENDPOINTS = {
    "TorchServe": "torchserve/throughput torchserve direct",
    "front on TorchServe, /embed": "torchserve/throughput /embed",
    "front on TorchServe, /v1/embeddings": "torchserve/throughput /v1/embeddings",
    "Triton HTTP": "triton/throughput triton-http direct",
    "Triton gRPC": "triton/throughput triton-grpc direct",
    "front on Triton, /embed": "triton/throughput /embed",
    "front on Triton, /v1/embeddings": "triton/throughput /v1/embeddings",
    "front on native, /embed": "native/throughput /embed",
    "front on native, /v1/embeddings": "native/throughput /v1/embeddings",
    "infinity-emb 0.0.78, optimum (ONNX Runtime)": "infinity-optimum",
}
ENGINES = ("TorchServe", "Triton HTTP", "Triton gRPC")
FRONTS = {"TorchServe": "front on TorchServe, /embed", "Triton HTTP": "front on Triton, /embed"}


def cell(values: list[float], digits: int = 2) -> str:
    return spread(values, digits) or "-"


def load(run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    points = json.loads((run / "results.json").read_text())["points"]
    offline = json.loads((run / "offline.json").read_text())
    return points, offline


def best(points: list[dict[str, Any]], label: str, seq: int) -> dict[str, Any] | None:
    rows = [p for p in points if p["endpoint"] == label and p["seq"] == seq and p.get("req_per_s")]
    return max(rows, key=lambda p: p["req_per_s"]) if rows else None


def lone(points: list[dict[str, Any]], label: str, seq: int) -> dict[str, Any] | None:
    rows = [p for p in points if p["endpoint"] == label and p["seq"] == seq]
    rows = [p for p in rows if p["concurrency"] == 1 and p.get("req_per_s")]
    return rows[0] if rows else None


Runs = list[tuple[list[dict[str, Any]], dict[str, Any]]]
Measure = Callable[[list[dict[str, Any]], dict[str, Any], int], float | None]


def header(seqs: list[int]) -> list[str]:
    return ["| | " + " | ".join(f"{s} tokens" for s in seqs) + " |", "|---|" + "---:|" * len(seqs)]


def best_table(data: Runs, seqs: list[int]) -> list[str]:
    out = ["### Best req/s over concurrency (1 or 32 clients), batch-1 requests", ""]
    out += header(seqs)
    for name, label in ENDPOINTS.items():
        cells = []
        for s in seqs:
            vals = [b["req_per_s"] for points, _ in data if (b := best(points, label, s))]
            cells.append(cell(vals, 0))
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    cells = [cell([o[str(s)]["texts_per_s"] for _, o in data if str(s) in o], 0) for s in seqs]
    name = "offline: the artifact's OpenVINO model in process, batches of 32"
    return [*out, f"| {name} | " + " | ".join(cells) + " |", ""]


def column(data: Runs, seqs: list[int], measure: Measure, digits: int = 2) -> list[str]:
    """One table row: `measure` of each run at each length, as median (min-max)."""
    cells = []
    for s in seqs:
        vals = [v for points, offline in data if (v := measure(points, offline, s)) is not None]
        cells.append(cell(vals, digits))
    return cells


def ratio_cells(data: Runs, seqs: list[int], top: str, bottom: str) -> list[str]:
    def ratio(points: list[dict[str, Any]], _: Any, s: int) -> float | None:
        a, b = best(points, ENDPOINTS[top], s), best(points, ENDPOINTS[bottom], s)
        return a["req_per_s"] / b["req_per_s"] if a and b else None

    return column(data, seqs, ratio)


def ratio_table(data: Runs, seqs: list[int]) -> list[str]:
    out = ["### Ratios", "", *header(seqs)]
    rows = {"TorchServe / Triton HTTP": ratio_cells(data, seqs, "TorchServe", "Triton HTTP")}
    for engine, front in FRONTS.items():
        rows[f"{front} / {engine} asked directly"] = ratio_cells(data, seqs, front, engine)

    def over_offline(points: list[dict[str, Any]], offline: dict[str, Any], s: int) -> float | None:
        engines = [b["req_per_s"] for e in ENGINES if (b := best(points, ENDPOINTS[e], s))]
        return (
            max(engines) / offline[str(s)]["texts_per_s"] if engines and str(s) in offline else None
        )

    cells = column(data, seqs, over_offline)
    rows["best engine / offline reference"] = cells
    # the native engine has no API of its own: its front is set against Triton's front
    # and against the offline reference
    native = "front on native, /embed"
    rows[f"{native} / front on Triton, /embed"] = ratio_cells(
        data, seqs, native, "front on Triton, /embed"
    )

    def native_over_offline(points: list[dict[str, Any]], offline: dict[str, Any], s: int):
        b = best(points, ENDPOINTS[native], s)
        return b["req_per_s"] / offline[str(s)]["texts_per_s"] if b and str(s) in offline else None

    rows[f"{native} / offline reference"] = column(data, seqs, native_over_offline)
    return [*out, *(f"| {k} | " + " | ".join(v) + " |" for k, v in rows.items()), ""]


def lone_table(data: Runs, seqs: list[int]) -> list[str]:
    out = ["### A lone request (one client): p50 ms; beyond the model's own time", ""]
    out += header(seqs)
    for engine in (*ENGINES, "front on native, /embed"):
        cells = []
        for s in seqs:
            rows = [r for points, _ in data if (r := lone(points, ENDPOINTS[engine], s))]
            over = [r["p50_ms"] - r["model_ms"] for r in rows if r.get("model_ms")]
            cells.append(f"{cell([r['p50_ms'] for r in rows], 1)}; +{cell(over, 1)}")
        out.append(f"| {engine} | " + " | ".join(cells) + " |")
    for engine, front in FRONTS.items():

        def added(points: list[dict[str, Any]], _: Any, s: int) -> float | None:
            f, e = lone(points, ENDPOINTS[front], s), lone(points, ENDPOINTS[engine], s)  # noqa: B023
            return f["p50_ms"] - e["p50_ms"] if f and e else None

        cells = ["+" + c for c in column(data, seqs, added)]
        out.append(f"| {front}, added to {engine} asked directly | " + " | ".join(cells) + " |")
    return [*out, ""]


def generator_lines(data: Runs) -> list[str]:
    out = ["### The load generator at 32 clients: the cores it used", ""]
    for name, label in ENDPOINTS.items():
        rows = [p for points, _ in data for p in points if p["endpoint"] == label]
        vals = [p["client_cores"] for p in rows if p["concurrency"] == 32 and p.get("req_per_s")]
        gens = ", ".join(sorted({p.get("generator") or "python" for p in rows}))
        out.append(f"- {name} ({gens}): {cell(vals)}")
    return out


def main(runs: list[Path]) -> None:
    data = [load(r) for r in runs]
    seqs = sorted({p["seq"] for points, _ in data for p in points})
    out = [f"Runs: {len(runs)}; median (min-max) over the runs, ratios taken run by run.", ""]
    out += best_table(data, seqs) + ratio_table(data, seqs) + lone_table(data, seqs)
    print("\n".join(out + generator_lines(data)))


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
