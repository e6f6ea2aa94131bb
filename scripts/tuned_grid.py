"""The tuned grid's benchmark (scripts/benchmark_tuned_grid.sh): the fixed length
distribution, and our server on each artifact in turn under wrk, rounds alternating.

    python scripts/tuned_grid.py texts OUT_FILE
    python scripts/tuned_grid.py run DEFAULT_ARTIFACT TUNED_ARTIFACT TEXTS OUT_DIR

The texts are a seeded draw: most of 16-40 words, a tenth of 60-110 (BERT's tokenizer
reads about one token a word, two more for its special tokens), so the compile default's
lengths (16, 32, 64, 128) pad most of them to 32 or 64.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [str(ROOT / ".venv" / "bin" / "neuronserve")]
WORDS = [
    "river",
    "bank",
    "boat",
    "the",
    "a",
    "sky",
    "report",
    "quarterly",
    "revenue",
    "market",
    "of",
    "and",
]


def texts(out: Path, count: int = 120) -> None:
    rng = random.Random(11)
    lengths = [rng.choice([16, 20, 28, 36, 40]) for _ in range(count - count // 10)]
    lengths += [rng.randint(60, 110) for _ in range(count // 10)]
    rng.shuffle(lengths)
    out.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(n)) for n in lengths) + "\n")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lua(bodies: list[bytes], folder: Path) -> Path:
    """wrk's script: each request the next body, round robin."""
    for i, b in enumerate(bodies):
        (folder / f"{i}.json").write_bytes(b)
    lua = folder / "bodies.lua"
    lua.write_text(
        "bodies = {}\n"
        f"for i = 0, {len(bodies) - 1} do local f = io.open('{folder}/' .. i .. '.json', 'rb'); "
        "bodies[#bodies + 1] = f:read('*a'); f:close() end\n"
        "wrk.method = 'POST'\nwrk.headers['Content-Type'] = 'application/json'\n"
        "n = 0\nrequest = function() n = n + 1\n"
        "  return wrk.format(nil, nil, nil, bodies[(n % #bodies) + 1]) end\n"
    )
    return lua


def _wrk(url: str, lua: Path, clients: int, seconds: int) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t", str(min(2, clients)), "-c", str(clients), "-d", f"{seconds}s", "--latency",
         "--timeout", "30s", "-s", str(lua), url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)\b", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[p50.group(2)]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50_ms": float(p50.group(1)) * scale,
            "non_2xx": int(errors.group(1)) if errors else 0}  # fmt: skip


def _served(
    artifact: Path, work: Path, lua: Path, concurrency: list[int], seconds: int
) -> dict[int, dict[str, float]]:
    """Our server on `artifact`, at each concurrency: wrk for WARM seconds first (the
    stand-in computes a row on the CPU the first time it sees it in a bucket; after that
    a call takes the device's time), then measured."""
    port = _port()
    run_dir = work / f"run-{artifact.name}"
    cmd = [*CLI, "serve", "front", str(artifact), "--port", str(port), "--run-dir", str(run_dir),
           "--auth", "off"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    try:
        url = f"http://127.0.0.1:{port}/embed"
        warm = int(os.environ.get("WARM", "15"))
        found = {}
        for c in concurrency:
            _wrk(url, lua, c, warm)
            before = _device(port)
            found[c] = _wrk(url, lua, c, seconds)
            after = _device(port)
            busy, answered = (a - b for a, b in zip(after, before, strict=True))
            found[c]["device_ms_per_request"] = busy * 1e3 / max(answered, 1)
            found[c]["chip_busy"] = busy / seconds
        return found
    finally:
        subprocess.run([*cmd, "--stop"], check=False, capture_output=True)


def _device(port: int) -> tuple[float, float]:
    """(the NeuronCore's busy seconds, requests answered) from the front's /metrics (the
    stand-in's neuron-monitor reports the core's busy time)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    busy = answered = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "neuronserve_neuroncore_busy_seconds_total":
                busy += sample.value
            elif sample.name == "neuronserve_front_requests_total":
                answered += sample.value
    return busy, answered


def run(default: Path, tuned: Path, texts_file: Path, out: Path) -> None:
    rounds = int(os.environ.get("RUNS", "3"))
    concurrency = [int(c) for c in os.environ.get("CONC", "1,16").split(",")]
    seconds = int(os.environ.get("DURATION", "10"))
    lines = [t for t in texts_file.read_text().splitlines() if t]
    bodies = [json.dumps({"inputs": t}).encode() for t in lines]
    results: dict[str, list[dict[int, dict[str, float]]]] = {"default": [], "tuned": []}
    with tempfile.TemporaryDirectory(prefix="ns-tuned-") as tmp:
        work = Path(tmp)
        lua = _lua(bodies, work)
        for r in range(rounds):
            order = [("default", default), ("tuned", tuned)]
            for label, art in order if r % 2 == 0 else order[::-1]:
                found = _served(art, work, lua, concurrency, seconds)
                results[label].append(found)
                print(f"round {r + 1} {label}: {json.dumps(found)}", file=sys.stderr)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(summary(results, default, tuned, len(lines)))


def summary(results: dict, default: Path, tuned: Path, texts_count: int) -> str:
    def grid(art: Path) -> str:
        m = json.loads((art / "manifest.json").read_text())
        return ", ".join(map(str, m["sequence_lengths"]))

    def med(label: str, c: int, key: str, digits: int = 1) -> str:
        values = [r[str(c)][key] if str(c) in r else r[c][key] for r in results[label]]
        m, lo, hi = statistics.median(values), min(values), max(values)
        return f"{m:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"

    lines = [
        f"{texts_count} texts, one per request, to /embed; median (range) over "
        f"{len(results['default'])} rounds, alternating",
        "",
        "| grid | sequence lengths | clients | req/s | p50 ms | device ms/request | chip busy "
        "| non-2xx |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, art in (("default", default), ("tuned", tuned)):
        for c in results[label][0]:
            errors = sum((r[c] if c in r else r[str(c)])["non_2xx"] for r in results[label])
            device = med(label, c, "device_ms_per_request", 3)
            lines.append(f"| {label} | {grid(art)} | {c} | {med(label, c, 'rps')} | "
                         f"{med(label, c, 'p50_ms')} | {device} | "
                         f"{med(label, c, 'chip_busy', 2)} | {errors} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    # a stopped benchmark stops the server it started (finally blocks run)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if sys.argv[1] == "texts":
        texts(Path(sys.argv[2]))
    else:
        run(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]))
