#!/usr/bin/env bash
# The CPU ratios in one run: the short-request comparison (MiniLM: both engines, the front,
# infinity-emb's optimum engine, the offline OpenVINO reference; scripts/benchmark_short.sh)
# and the engines against the vanilla transformers pipeline (MiniLM and DistilBERT-base;
# scripts/benchmark_engines.sh), one after the other on a quiet machine, then each ratio
# against the committed run it replaces (scripts/cpu_ratios.py). About an hour on 2 cores.
#
#   INFINITY=/tmp/infvenv/bin/infinity_emb scripts/benchmark_cpu_ratios.sh  # in benchmarks/cpu-ratios/
#
# INFINITY: the peer's venv as scripts/benchmark_short.sh describes it (optimum engine).
# OUT, RUNS override; BEFORE_SHORT, BEFORE_MINILM, BEFORE_DISTILBERT name the runs compared.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${INFINITY:?set INFINITY to the infinity_emb of the peer venv (see scripts/benchmark_short.sh)}"
OUT=$(realpath -m "${OUT:-benchmarks/cpu-ratios}")
mkdir -p "$OUT"
date -u +"started %Y-%m-%dT%H:%M:%SZ on $(git rev-parse --short HEAD)" > "$OUT/when.txt"
OUT=$OUT/short scripts/benchmark_short.sh
# the pipeline is these runs' baseline; the peer (its optimum engine) was in the short run
INFINITY= MODEL=minilm OUT=$OUT/engines-minilm scripts/benchmark_engines.sh
INFINITY= MODEL=distilbert-base OUT=$OUT/engines-distilbert-base scripts/benchmark_engines.sh
date -u +"ended %Y-%m-%dT%H:%M:%SZ" >> "$OUT/when.txt"
.venv/bin/python scripts/cpu_ratios.py \
  --before-short "${BEFORE_SHORT:-benchmarks/short}" --short "$OUT/short" \
  --before-engines "${BEFORE_MINILM:-benchmarks/engines-minilm-openvino}" \
  --engines "$OUT/engines-minilm" \
  --before-engines "${BEFORE_DISTILBERT:-benchmarks/engines-distilbert-base-openvino}" \
  --engines "$OUT/engines-distilbert-base" > "$OUT/ratios.md"
cat "$OUT/ratios.md"
