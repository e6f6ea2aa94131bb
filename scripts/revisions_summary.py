"""The summary of `scripts/benchmark_revisions.sh`: per point, the new revision against
the base, round by round (each round ran both back to back), as median
(min-max) over the rounds: req/s, the ratio, the CPU per request (all processes, and the
front's), and the median latency.

    .venv/bin/python scripts/revisions_summary.py benchmarks/revisions "<new>" "<base>"
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spread import spread

CPU = ("workers", "frontend", "front", "client")


def points(run: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    found = json.loads((run / "results.json").read_text())["points"]
    return {(p["endpoint"], p["seq"], p["concurrency"]): p for p in found if not p.get("errors")}


def cpu_ms(p: dict[str, Any]) -> float:
    return sum(p.get(f"cpu_ms_per_req_{role}") or 0.0 for role in CPU)


def both(base: list, new: list, figure: Callable[[dict[str, Any]], float], digits: int) -> list:
    return [spread([figure(p) for p in base], digits), spread([figure(p) for p in new], digits)]


def main(out: Path, new_label: str, base_label: str) -> str:
    rounds = sorted({int(d.name.split("-")[1]) for d in out.glob("base-*")})
    pairs = [(points(out / f"base-{r}"), points(out / f"new-{r}")) for r in rounds]
    keys = [k for k in pairs[0][0] if all(k in b and k in n for b, n in pairs)]
    lines = [
        f"## {new_label} against {base_label}, {len(rounds)} rounds in alternating order",
        "",
        "| endpoint | tokens | c | req/s base | new | new / base | CPU ms/req base | new "
        "| front CPU ms/req base | new | p50 ms base | new |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in keys:
        base, new = [b[key] for b, _ in pairs], [n[key] for _, n in pairs]
        ratio = [n["req_per_s"] / b["req_per_s"] for b, n in zip(base, new, strict=True)]
        cells = [
            *both(base, new, lambda p: p["req_per_s"], 0),
            spread(ratio, 2),
            *both(base, new, cpu_ms, 2),
            *both(base, new, lambda p: p.get("cpu_ms_per_req_front") or 0.0, 2),
            *both(base, new, lambda p: p["p50_ms"], 1),
        ]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]), end="")
