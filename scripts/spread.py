"""The spread of several runs of one bench command: per endpoint and point, the median and
range of req/s, of the ratio to vanilla and of the front's CPU per request. Absolute
numbers on shared machines move between runs; a figure is worth quoting with its spread.

    python scripts/spread.py RUN_DIR [RUN_DIR ...] > summary.md
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from neuronserve.bench.floor import floor_ms, point_peaks

FIGURES = (
    ("req_per_s", "req/s", 1),
    ("ratio_vs_vanilla", "x vanilla", 2),
    ("p50_ms", "p50 ms", 1),
    ("model_ms", "model ms", 1),
    ("beyond_model_ms", "p50 beyond the model ms", 1),
    ("over_int8_floor", "model / int8 floor", 1),
    ("vanilla_over_loop", "vanilla / plain loop", 3),
    ("cpu_ms_per_req_front", "front CPU ms/req", 2),
)


def derived(r: dict[str, Any], peaks: dict[str, Any] | None = None) -> dict[str, Any]:
    """A point with the figures computed from its own: what a lone request pays beyond
    the model and the model's time over its arithmetic at the run's int8 peak
    (concurrency 1), and the vanilla endpoint over a bare pipeline() loop."""
    out = dict(r)
    if r.get("concurrency") == 1 and r.get("model_ms") is not None:
        out["beyond_model_ms"] = r["p50_ms"] - r["model_ms"]
        peak = point_peaks(r, peaks).get("int8")
        if peak and r.get("model_gflop"):
            out["over_int8_floor"] = r["model_ms"] / floor_ms(r["model_gflop"], peak)
    if r.get("plain_loop_req_per_s"):
        out["vanilla_over_loop"] = r["req_per_s"] / r["plain_loop_req_per_s"]
    return out


def spread(values: list[float], digits: int) -> str:
    if not values:
        return ""
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def markdown(runs: list[dict[str, Any]]) -> str:
    by_point: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for results in runs:
        for r in results["points"]:
            if r.get("req_per_s"):
                key = (r["endpoint"], r["seq"], r["texts"], r["concurrency"])
                by_point[key].append(derived(r, results.get("peak_gops")))
    shown = [f for f in FIGURES if any(f[0] in r for rows in by_point.values() for r in rows)]
    m = runs[0]["machine"]
    lines = [
        f"Median (min-max) over {len(runs)} runs of `{runs[0]['command']}`, "
        f"{runs[0]['started']} to {runs[-1]['started']} (UTC); {m['cpu']}, {m['cores']} cores"
        f" ({' '.join(m.get('cpu_flags') or ['SIMD flags not recorded'])}).",
        "",
        "| endpoint | seq | texts | c | " + " | ".join(label for _, label, _ in shown) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(shown),
    ]
    for (endpoint, seq, texts, c), rows in by_point.items():
        cells = [spread([r[k] for r in rows if k in r], d) for k, _, d in shown]
        lines.append(f"| {endpoint} | {seq} | {texts} | {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    dirs = sys.argv[1:] if argv is None else argv
    if not dirs:
        print(__doc__, file=sys.stderr)
        return 2
    runs = [json.loads((Path(d) / "results.json").read_text()) for d in dirs]
    print(markdown(runs), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
