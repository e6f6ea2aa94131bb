#!/usr/bin/env bash
# TorchServe's lone request with and without its batch wait: the short-request artifact
# (scripts/benchmark_short.sh builds it) asked directly at 8 and 16 tokens, from 1 and 32
# clients, with the packaged batch size and with `--batch-requests 1` (TorchServe's
# aggregator then sends each request on at once instead of waiting its least
# maxBatchDelay, 1 ms, for a second one). Three runs, alternating; results in
# benchmarks/torchserve-wait/ (or $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 2; }
ART=${ART:-.bench/art/minilm-short}
OUT=${OUT:-benchmarks/torchserve-wait}
[ -f "$ART/manifest.json" ] || { echo "no artifact at $ART: run scripts/benchmark_short.sh first" >&2; exit 2; }
for i in 1 2 3; do
  for batch in packaged 1; do
    extra=()
    [ "$batch" = 1 ] && extra=(--batch-requests 1)
    rm -rf "$OUT/run$i-batch-$batch"
    .venv/bin/neuronserve bench --title "TorchServe, batch size $batch, run $i" \
      -e "torchserve=torchserve:$ART" "${extra[@]}" --generator wrk \
      --sequence-lengths 8,16 --concurrency 1,32 --warmup 2 --duration 4 \
      --server-warmup 10 --out "$OUT/run$i-batch-$batch"
  done
done
.venv/bin/python - "$OUT" > "$OUT/summary.md" <<'PY'
"""Per run and batch size: the lone request (p50, the model's own time, the rest) and
req/s at 32 clients, read from each run's results.md."""
import re
import sys
from pathlib import Path

out = Path(sys.argv[1])
print("| run | batch size | tokens | lone p50 ms | model ms | beyond the model ms | queue ms (1 client) | req/s, 32 clients |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for d in sorted(out.glob("run*-batch-*")):
    md = (d / "results.md").read_text()
    run, batch = re.match(r"run(\d+)-batch-(.+)", d.name).groups()
    for seq in ("8", "16"):
        lone = re.search(rf"^\| torchserve/throughput \| {seq} \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", md, re.M)
        point = re.search(rf"^\| torchserve/throughput \| {seq} \| 1 \| 32 \| ([\d.]+) \|", md, re.M)
        queue = re.search(rf"^\| torchserve/throughput \| {seq} \| 1 \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|", md, re.M)
        print(f"| {run} | {batch} | {seq} | {lone[1]} | {lone[2]} | {lone[3]} | {queue[1]} | {point[1]} |")
PY
cat "$OUT/summary.md"
