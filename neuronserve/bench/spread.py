"""The spread of several runs of one bench command: per endpoint and point, the median and
range of req/s and of each ratio the runs report (to vanilla, to the engine asked
directly), and of the front's CPU per request. Absolute numbers on shared machines move
between runs; a figure is worth quoting with its spread.

    python -m neuronserve.bench.spread RUN_DIR [RUN_DIR ...] > summary.md
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

FIGURES = (
    ("req_per_s", "req/s", 1),
    ("ratio_vs_engine", "x engine direct", 2),
    ("ratio_vs_vanilla", "x vanilla", 2),
    ("p50_ms", "p50 ms", 1),
    ("cpu_ms_per_req_front", "front CPU ms/req", 2),
)


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
                by_point[(r["endpoint"], r["seq"], r["texts"], r["concurrency"])].append(r)
    shown = [f for f in FIGURES if any(f[0] in r for rows in by_point.values() for r in rows)]
    m = runs[0]["machine"]
    lines = [
        f"Median (min-max) over {len(runs)} runs of `{runs[0]['command']}`, "
        f"{runs[0]['started']} to {runs[-1]['started']} (UTC); {m['cpu']}, {m['cores']} cores.",
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
