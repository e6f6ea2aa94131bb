"""Bench results as CSV, JSON, a markdown summary and PNG plots."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from .floor import floor_ms, point_peaks

COLUMNS = [
    "endpoint",
    "type",
    "layout",
    "seq",
    "texts",
    "concurrency",
    "requests",
    "errors",
    "wall_s",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "max_ms",
    "req_per_s",
    "texts_per_s",
    "ratio_vs_vanilla",
    "client_cores",
    "generator",
    "mean_ms",
    "model_ms",
    "cpu_ms_per_req_client",
    "cpu_ms_per_req_workers",
    "cpu_ms_per_req_front",
    "ratio_vs_baseline",
    "plain_loop_req_per_s",
    "torch_threads",
    "session",
    "error_sample",
]


def write_all(results: dict[str, Any], out: Path, title: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.csv", out / "results.md"]
    paths[0].write_text(json.dumps(results, indent=2) + "\n")
    with open(paths[1], "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in results["points"]:
            w.writerow({k: _fmt(r.get(k)) for k in COLUMNS})
    paths[2].write_text(markdown(results, title))
    paths.extend(plots(results, out))
    return paths


def _fmt(v: Any) -> Any:
    return round(v, 3) if isinstance(v, float) else v


def _table(title: str, header: list[str], rows: list[list[Any]], intro: str = "") -> list[str]:
    """A markdown table under its title: the first column and any `header` ending in `<`
    aligned left, the rest right (figures)."""
    left = [i == 0 or h.endswith("<") for i, h in enumerate(header)]
    names = [h.removesuffix("<") for h in header]
    return [
        f"### {title}",
        "",
        *([intro, ""] if intro else []),
        "| " + " | ".join(names) + " |",
        "|" + "".join("---|" if a else "---:|" for a in left),
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
        "",
    ]


def best_by_seq(points: list[dict[str, Any]], texts: int = 1) -> dict[str, dict[int, dict]]:
    """endpoint -> seq -> the point with the highest req/s (over concurrency)."""
    best: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in points:
        if r["texts"] != texts or not r.get("req_per_s"):
            continue
        cur = best[r["endpoint"]].get(r["seq"])
        if cur is None or r["req_per_s"] > cur["req_per_s"]:
            best[r["endpoint"]][r["seq"]] = r
    return best


def markdown(results: dict[str, Any], title: str) -> str:
    points = results["points"]
    m = results["machine"]
    lines = [
        f"## {title}",
        "",
        f"- date (UTC): {results['started']}",
        f"- machine: {m['cpu']}, {m['cores']} cores ({_flags(m)}), {m['memory_gib']} GiB; "
        f"Python {m['python']}, torch {m['torch']}",
        f"- command: `{results['command']}`",
        *generator_lines(points),
        "",
    ]
    for texts in sorted({r["texts"] for r in points}):
        lines += best_table(points, texts)
    lines += front_table(points)
    lines += wrk_lines(results.get("wrk_check"))
    lines += split_table(results)
    lines += pace_table(results)
    lines += floor_table(results)
    lines += baseline_check(points)
    lines += every_point_table(points)
    return "\n".join(lines) + "\n"


def generator_lines(points: list[dict[str, Any]]) -> list[str]:
    """Which load generator drove the points, and the most of the machine it took."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in points:
        by[r.get("generator", "python")].append(r)
    names = {
        "wrk": "wrk (C, one thread)",
        "python": "neuronserve bench's own (HTTP on one event loop, gRPC a thread per client)",
    }
    return [
        f"- load generator: {names.get(g, g)} for {len(rows)} point(s), using at most "
        f"{max(r.get('client_cores', 0.0) for r in rows):.2f} of a core (the client cores column)"
        for g, rows in sorted(by.items())
    ]


def best_table(points: list[dict[str, Any]], texts: int) -> list[str]:
    """Best req/s over concurrency per endpoint and length, with the ratio to vanilla."""
    best = best_by_seq(points, texts)
    if not best:
        return []
    seqs = sorted({s for b in best.values() for s in b})

    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return ""
        ratio = f" ({r['ratio_vs_vanilla']:.1f}x)" if r.get("ratio_vs_vanilla") else ""
        return f"{r['req_per_s']:.1f}{ratio} [c{r['concurrency']}]"

    return _table(
        f"Best req/s over concurrency, {texts} text(s) per request (ratio to the vanilla "
        "pipeline in this run; concurrency in brackets)",
        ["endpoint", *(f"seq {s}" for s in seqs)],
        [[name, *(cell(by_seq.get(s)) for s in seqs)] for name, by_seq in best.items()],
    )


def front_table(points: list[dict[str, Any]]) -> list[str]:
    """Each route through the front against its /invocations, on the same processes at
    the same point."""
    rows = [r for r in points if r.get("ratio_vs_baseline")]
    if not rows:
        return []
    baseline = {
        (r["session"], r["seq"], r["texts"], r["concurrency"]): r
        for r in points
        if r.get("baseline")
    }
    cells = []
    for r in rows:
        e = baseline[(r["session"], r["seq"], r["texts"], r["concurrency"])]
        cells.append(
            [r["endpoint"], r["seq"], r["texts"], r["concurrency"], f"{r['req_per_s']:.1f}",
             f"{e['req_per_s']:.1f}", f"{r['ratio_vs_baseline']:.2f}",
             f"{r['p50_ms']:.1f} ({e['p50_ms']:.1f})", _cell2(r, "cpu_ms_per_req_front")]
        )  # fmt: skip
    return _table(
        "The front's routes against its /invocations (same processes, same point)",
        ["route", "seq", "texts", "c", "req/s", "/invocations req/s", "ratio",
         "p50 ms (/invocations)", "CPU ms/req of the front"],
        cells,
    )  # fmt: skip


def _cell2(r: dict[str, Any], key: str) -> str:
    v = r.get(key)
    return f"{v:.2f}" if isinstance(v, (int, float)) else ""


def wrk_lines(check: dict[str, Any] | None) -> list[str]:
    if not check:
        return []
    if "wrk" not in check:
        return [f"Load generator cross-check skipped: {check['skipped']}", ""]
    w, o = check["wrk"], check["ours"]
    handled = (
        f" The handler counted {w['server_handled']} requests during wrk's "
        f"{w.get('requests', '?')}."
        if "server_handled" in w
        else ""
    )
    return [
        "### Load generator cross-check",
        "",
        f"`{w['command']}` against {check['endpoint']} at seq {check['seq']}, "
        f"concurrency {check['concurrency']}: wrk {w['req_per_s']:.1f} req/s "
        f"(p50 {w.get('p50_ms', float('nan')):.1f} ms, p99 "
        f"{w.get('p99_ms', float('nan')):.1f} ms); neuronserve bench "
        f"{o['req_per_s']:.1f} req/s (p50 {o['p50_ms']:.1f} ms, p99 {o['p99_ms']:.1f} "
        f"ms) using {o['client_cores']:.2f} cores: ours/wrk = "
        f"{check['ours_over_wrk']:.2f}." + handled,
        "",
    ]


def every_point_table(points: list[dict[str, Any]]) -> list[str]:
    rows = []
    for r in points:
        head = [r["endpoint"], r["seq"], r["texts"], r["concurrency"]]
        if not r.get("req_per_s"):
            rows.append([*head, "failed", "", "", "", "", "", "", r["errors"]])
            continue
        ratio = f"{r['ratio_vs_vanilla']:.2f}" if r.get("ratio_vs_vanilla") else ""
        figures = [f"{r[k]:.1f}" for k in ("req_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms")]
        rows.append([*head, *figures, ratio, f"{r['client_cores']:.2f}", r["errors"]])
    return _table(
        "Every point",
        ["endpoint", "seq", "texts", "c", "req/s", "p50 ms", "p95 ms", "p99 ms", "max ms",
         "x vanilla", "client cores", "errors"],
        rows,
    )  # fmt: skip


def _flags(machine: dict[str, Any]) -> str:
    flags = machine.get("cpu_flags")
    return "flags " + " ".join(flags) if flags else "SIMD flags not recorded"


def _cell(r: dict[str, Any], key: str) -> str:
    v = r.get(key)
    return f"{v:.1f}" if isinstance(v, (int, float)) else ""


def split_table(results: dict[str, Any]) -> list[str]:
    """Per request, for the servers bench started: CPU milliseconds by process role,
    which bound throughput at cores / total."""
    rows = [r for r in results["points"] if r.get("req_per_s") and "cpu_ms_per_req_workers" in r]
    if not rows:
        return []
    cores = results["machine"]["cores"]
    cells = []
    for r in rows:
        total = sum(r.get(k, 0.0) for k in r if k.startswith("cpu_ms_per_req_"))
        if total:
            cells.append(
                [r["endpoint"], r["seq"], r["concurrency"], f"{r['req_per_s']:.1f}",
                 *(_cell(r, k) for k in ("mean_ms", "cpu_ms_per_req_workers",
                                         "cpu_ms_per_req_front", "cpu_ms_per_req_client")),
                 f"{total:.1f}", f"{cores * 1000 / total:.0f}"]
            )  # fmt: skip
    return _table(
        "Where the CPU goes (per request, measuring window)",
        ["endpoint", "seq", "c", "req/s", "mean ms", "CPU workers", "CPU front", "CPU client",
         "CPU total", "cores x 1000 / total"],
        cells,
        "Milliseconds of CPU each process role used per request; at saturation a "
        f"{cores}-core machine serves at most {cores} x 1000 / total req/s.",
    )  # fmt: skip


def pace_table(results: dict[str, Any]) -> list[str]:
    """On a Neuron host (neuron-monitor ran): each point's NeuronCore utilization
    beside the share of the host's CPUs the deployment and the client used, and which
    of the two set the pace."""
    from ..host_load import pace

    rows = [r for r in results["points"] if "neuroncore_busy" in r and r.get("req_per_s")]
    if not rows:
        return []
    cores = results["machine"]["cores"]
    cells = []
    for r in rows:
        cpu = sum(r.get(k, 0.0) for k in r if k.startswith("cpu_ms_per_req_"))
        host = cpu * r["req_per_s"] / (cores * 1000)
        cells.append(
            [r["endpoint"], r["seq"], r["concurrency"], f"{r['req_per_s']:.1f}",
             f"{r['neuroncore_busy']:.0%}", f"{host:.0%}", f"{cpu:.2f}",
             pace(r["neuroncore_busy"], host).split(":")[0]]
        )  # fmt: skip
    return _table(
        "The chip against the host",
        ["endpoint", "seq", "c", "req/s", "NeuronCore busy", "host CPU busy", "CPU ms/req",
         "pace set by<"],
        cells,
        "NeuronCore busy: the mean utilization neuron-monitor reported for the cores in "
        "use during the point; host CPU busy: CPU per request of every process (the "
        f"client's included) x req/s over the machine's {cores} cores.",
    )  # fmt: skip


def floor_table(results: dict[str, Any]) -> list[str]:
    """The model time of a lone request against the least time the machine could take for
    its arithmetic: at the probe's int8 peak, and at the peak of the precision it runs."""
    peaks = results.get("peak_gops") or {}
    rows = [
        r
        for r in results["points"]
        if r.get("concurrency") == 1
        and r.get("model_ms")
        and r.get("model_gflop")
        and point_peaks(r, peaks)
    ]
    if not rows:
        return []
    probes = ", ".join(
        f"{t} thread(s): " + ", ".join(f"{k} {v:g}" for k, v in g.items()) for t, g in peaks.items()
    )
    cells = []
    for r in rows:
        peak = point_peaks(r, peaks)
        gop, ms = r["model_gflop"], r["model_ms"]
        int8_ms = floor_ms(gop, peak["int8"])
        own = peak.get(r.get("precision", ""))
        own_ms = floor_ms(gop, own) if own else None
        cells.append(
            [r["endpoint"], r["seq"], r.get("precision", ""), f"{ms:.2f}", f"{gop:.3f}",
             f"{gop / ms * 1e3:.1f}", f"{int8_ms:.2f}", f"{ms / int8_ms:.1f}",
             *((f"{own_ms:.2f}", f"{ms / own_ms:.1f}") if own_ms else ("", ""))]
        )  # fmt: skip
    return _table(
        "The model against the machine's floor (concurrency 1)",
        ["endpoint", "seq", "precision<", "model ms", "GOP", "achieved GOP/s",
         "floor ms at int8 peak", "model / int8 floor", "floor ms at its precision",
         "model / that floor"],
        cells,
        "Arithmetic per request from the model's config (bench/floor.py: projections, "
        "feed-forward, attention), over the peak matrix-multiply throughput a probe measured "
        f"on a worker's cores after the servers stopped (GOP/s, {probes}). A model time "
        "near its floor gets faster only with less or cheaper arithmetic.",
    )  # fmt: skip


def baseline_check(points: list[dict[str, Any]]) -> list[str]:
    """The vanilla endpoint against the pipeline called in a bare loop in the same
    process: the ratios above are only as honest as that denominator."""
    rows = [r for r in points if r.get("plain_loop_req_per_s")]
    if not rows:
        return []
    return _table(
        "The baseline, checked",
        ["endpoint", "seq", "texts", "torch threads", "vanilla req/s", "plain loop req/s",
         "vanilla / loop"],
        [[r["endpoint"], r["seq"], r["texts"], r.get("torch_threads", ""),
          f"{r['req_per_s']:.1f}", f"{r['plain_loop_req_per_s']:.1f}",
          f"{r['req_per_s'] / r['plain_loop_req_per_s']:.3f}"] for r in rows],
        "The vanilla endpoint (the `transformers` pipeline driven by the load generator, "
        "one request at a time) against the same pipeline called in a plain loop right "
        "after it, same process and threads, after three warm-up calls.",
    )  # fmt: skip


def plots(results: dict[str, Any], out: Path) -> list[Path]:
    """p95 latency vs sequence length, and throughput vs concurrency per length (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [r for r in results["points"] if r.get("req_per_s")]
    texts = min((r["texts"] for r in points), default=1)
    written = [_p95_plot(plt, points, texts, out / "p95_vs_sequence_length.png")]
    if points:
        written.append(_throughput_plot(plt, points, texts, out / "throughput_vs_concurrency.png"))
    return written


def _p95_plot(plt: Any, points: list[dict[str, Any]], texts: int, path: Path) -> Path:
    """One request at a time, like the seeds' figures."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in points:
        if r["concurrency"] == 1 and r["texts"] == texts:
            by[r["endpoint"]].append((r["seq"], r["p95_ms"]))
    for name, xy in by.items():
        xy.sort()
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("p95 latency (ms)")
    ax.set_title(f"p95 latency, concurrency 1, {texts} text(s) per request")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _throughput_plot(plt: Any, points: list[dict[str, Any]], texts: int, path: Path) -> Path:
    """One panel per sequence length; in-process endpoints (one request at a time) are
    reference lines."""
    seqs = sorted({r["seq"] for r in points})
    cols = min(len(seqs), 4)
    rows_n = (len(seqs) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols, 3.4 * rows_n), squeeze=False)
    for ax, seq in zip(axes.flat, seqs, strict=False):
        lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in points:
            if r["seq"] == seq and r["texts"] == texts:
                lines[r["endpoint"]].append((r["concurrency"], r["req_per_s"]))
        for name, xy in lines.items():
            xy.sort()
            if len(xy) == 1:
                ax.axhline(
                    xy[0][1],
                    linestyle="--",
                    linewidth=1,
                    label=name,
                    color="grey" if "vanilla" in name else None,
                )
            else:
                ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"seq {seq}")
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("req/s")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(seqs) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
