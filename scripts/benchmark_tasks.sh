#!/usr/bin/env bash
# Every encoder task beyond embeddings against its transformers baseline in the same run:
# random-weight DistilBERT-base heads (rerank, token-classification, question-answering,
# fill-mask) and ViT-base (image-classification, 1000 labels, 224 pixels), each compiled
# for the CPU (precision auto), behind TorchServe and Triton, next to the vanilla
# baseline (bench/work.py: the task's pipeline; for question answering, which
# transformers 5 no longer has a pipeline for, its tokenizer's windows and the eager
# model). A lone request (1 client) and throughput (16 clients), RUNS runs for the spread;
# one text, question or image per request, and a rerank of 8 documents per query. The
# question-answering grid reaches 384 tokens, the baseline's window, so both split a
# context into the same windows (stride 128).
# Results go to benchmarks/tasks-$TASK/ (run*/ and summary.md).
#
#   scripts/benchmark_tasks.sh                       # every task (about 70 minutes, 2 cores)
#   TASKS="rerank question-answering" RUNS=1 scripts/benchmark_tasks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/neuronserve ] || scripts/install.sh
NS=.venv/bin/neuronserve
WORK=${WORK:-.bench}
RUNS=${RUNS:-3}
TASKS=${TASKS:-rerank token-classification question-answering fill-mask image-classification}
mkdir -p "$WORK/art"
for TASK in $TASKS; do
  OUT=${OUT_ROOT:-benchmarks}/tasks-$TASK
  PER_REQUEST=1
  case "$TASK" in
    rerank) ARCH=distilbert-base; GRID=(--batch-sizes 1,2,4,8 --sequence-lengths 16,32,64,128); SEQS=16,128; PER_REQUEST=8 ;;
    image-classification) ARCH=vit-base; GRID=(--batch-sizes 1,2,4); SEQS=224 ;;
    question-answering) ARCH=distilbert-base; GRID=(--batch-sizes 1,2,4,8 --sequence-lengths 64,128,256,384); SEQS=64,256,512 ;;
    *) ARCH=distilbert-base; GRID=(--batch-sizes 1,2,4,8 --sequence-lengths 16,32,64,128); SEQS=16,128 ;;
  esac
  MODEL_DIR="$WORK/$ARCH-$TASK"
  [ -f "$MODEL_DIR/config.json" ] || .venv/bin/python scripts/random_model.py "$ARCH" "$MODEL_DIR" --task "$TASK"
  ART="$WORK/art/$ARCH-$TASK"
  rm -rf "$ART" && mkdir -p "$OUT"
  $NS compile --model "$MODEL_DIR" --task "$TASK" "${GRID[@]}" --out "$ART" --name "${TASK%%-*}"
  .venv/bin/python -c "
import sys
from neuronserve.compile.driver import describe
print(describe(sys.argv[1]))" "$ART" > "$OUT/precision.txt"
  for i in $(seq 1 "$RUNS"); do
    rm -rf "$OUT/run$i"
    $NS bench --title "$TASK ($ARCH, random weights): the front against the transformers baseline, run $i" \
      -e "front=front:$ART" -e "vanilla=vanilla:$MODEL_DIR" \
      --task "$TASK" \
      --sequence-lengths "$SEQS" --texts-per-request "$PER_REQUEST" --concurrency 1,16 --server-warmup 15 \
      --warmup 2 --duration 4 --min-requests 10 --out "$OUT/run$i"
  done
  .venv/bin/python scripts/spread.py "$OUT"/run* > "$OUT/summary.md"
  cat "$OUT/summary.md"
done
