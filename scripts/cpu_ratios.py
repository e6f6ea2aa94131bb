"""The CPU ratios, a new run against the committed one it replaces: for each ratio the
median (min-max) over each run's rounds, and whether the new one got worse (its best round
below the old one's worst; ranges that overlap are within the noise of three rounds).

    .venv/bin/python scripts/cpu_ratios.py --before-short benchmarks/short \
        --short benchmarks/cpu-ratios/short \
        --before-engines benchmarks/engines-minilm-openvino \
        --engines benchmarks/cpu-ratios/engines-minilm [--before-engines B --engines N ...]

Short requests (MiniLM, best over 1 and 32 clients): the best engine over infinity-emb's
optimum engine and over the offline OpenVINO reference, and each front over its engine.
Engines (`scripts/benchmark_engines.sh`, 16 clients): each engine over the vanilla
`transformers` pipeline of the same round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from short_summary import ENDPOINTS, ENGINES, FRONTS, best, load

from neuronserve.bench.spread import spread

Points = list[dict[str, Any]]
PEER = "infinity-emb 0.0.78, optimum (ONNX Runtime)"


def rounds(folder: Path) -> list[Path]:
    found = sorted(p for p in folder.glob("run*") if (p / "results.json").is_file())
    if not found:
        raise SystemExit(f"{folder}: no run*/results.json")
    return found


def best_engine(points: Points, seq: int) -> float | None:
    found = [b["req_per_s"] for e in ENGINES if (b := best(points, ENDPOINTS[e], seq))]
    return max(found) if found else None


def short_ratios(folder: Path) -> dict[str, list[float]]:
    """Each short-request ratio, one value per round."""
    out: dict[str, list[float]] = {}

    def add(name: str, value: float | None) -> None:
        if value is not None:
            out.setdefault(name, []).append(value)

    for run in rounds(folder):
        points, offline = load(run)
        for seq in sorted({p["seq"] for p in points}):
            top = best_engine(points, seq)
            peer = best(points, ENDPOINTS[PEER], seq)
            ref = offline.get(str(seq), {}).get("texts_per_s")
            add(
                f"MiniLM {seq} tokens: best engine / infinity-emb optimum",
                top / peer["req_per_s"] if top and peer else None,
            )
            add(
                f"MiniLM {seq} tokens: best engine / offline OpenVINO reference",
                top / ref if top and ref else None,
            )
            for engine, front in FRONTS.items():
                a, b = best(points, ENDPOINTS[front], seq), best(points, ENDPOINTS[engine], seq)
                add(
                    f"MiniLM {seq} tokens: {front} / {engine}",
                    a["req_per_s"] / b["req_per_s"] if a and b else None,
                )
    return out


def engine_ratios(folder: Path) -> dict[str, list[float]]:
    """Each engine over the vanilla pipeline at 16 clients, one value per round (Triton:
    its faster protocol of the round)."""
    out: dict[str, list[float]] = {}
    for run in rounds(folder):
        data = json.loads((run / "results.json").read_text())
        # the bench title names the model: "minilm: TorchServe and Triton ..., run 1"
        model = data.get("command", "").split("--title ", 1)[-1].split(":", 1)[0] or folder.name
        this_round: dict[str, float] = {}
        for p in data["points"]:
            ratio = p.get("ratio_vs_vanilla")
            engine = p["endpoint"].split("/")[0]
            if ratio is None or p["concurrency"] != 16 or engine not in ("torchserve", "triton"):
                continue  # the baseline, a lone client or a peer
            name = f"{model} {p['seq']} tokens: {engine} / vanilla (16 clients)"
            this_round[name] = max(this_round.get(name, 0.0), ratio)
        for name, ratio in this_round.items():
            out.setdefault(name, []).append(ratio)
    return out


def machine(folder: Path) -> tuple[frozenset[str], dict[str, float]]:
    """The CPU flags and the per-core matrix probe (GOP/s by precision) of a run's first
    round: what says whether two runs were on the same kind of CPU."""
    data = json.loads((rounds(folder)[0] / "results.json").read_text())
    probe = next(iter((data.get("peak_gops") or {}).values()), {})
    return frozenset(data["machine"].get("cpu_flags", [])), probe


def other_cpu(before: Path, now: Path, tolerance: float = 0.25) -> str | None:
    """Why two runs' ratios do not compare (None: they do): other CPU flags, or a matrix
    probe that differs by more than `tolerance` in some precision (the models' precisions
    speed up by different factors from one CPU generation to the next, the fp32 pipeline
    by yet another, so ratios move with the CPU, not the code)."""
    (flags_a, probe_a), (flags_b, probe_b) = machine(before), machine(now)
    if flags_a != flags_b:
        return f"other CPU flags ({' '.join(sorted(flags_a ^ flags_b))})"
    for precision in sorted(set(probe_a) & set(probe_b)):
        a, b = probe_a[precision], probe_b[precision]
        if abs(b - a) > tolerance * a:
            return f"other CPU ({precision} probe {a:.0f} -> {b:.0f} GOP/s per core)"
    return None


def compare(
    before: dict[str, list[float]], now: dict[str, list[float]], differs: str | None
) -> Iterator[str]:
    for name, new in now.items():
        old = before.get(name)
        if not old:
            yield f"| {name} | - | {spread(new, 2)} | | new |"
            continue
        worse = max(new) < min(old)
        change = statistics.median(new) / statistics.median(old)
        verdict = f"not compared: {differs}" if differs else "**worse**" if worse else "not worse"
        yield f"| {name} | {spread(old, 2)} | {spread(new, 2)} | {change:.2f} | {verdict} |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before-short", type=Path, required=True)
    parser.add_argument("--short", type=Path, required=True)
    parser.add_argument("--before-engines", type=Path, action="append", default=[])
    parser.add_argument("--engines", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    if len(args.before_engines) != len(args.engines):
        parser.error("give one --before-engines per --engines")
    pairs: list[tuple[Callable[[Path], dict[str, list[float]]], Path, Path]] = [
        (short_ratios, args.before_short, args.short),
        *((engine_ratios, b, n) for b, n in zip(args.before_engines, args.engines, strict=True)),
    ]
    lines = [
        "Each ratio: median (min-max) over the rounds of the committed run, then of the new",
        "one, ratios taken round by round; the medians' change; worse when the new best round",
        "is below the old worst; not compared when the two ran on other kinds of CPU.",
        "",
        "| ratio | before | now | now / before | |",
        "|---|---:|---:|---:|---|",
    ]
    for ratios, before, now in pairs:
        lines += compare(ratios(before), ratios(now), other_cpu(before, now))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
