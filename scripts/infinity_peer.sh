# Sourced by the benchmarks that measure infinity-emb's optimum engine beside our server:
# `start_infinity MODEL_DIR NAME` serves a copy of the model (scripts/peer_onnx.py, once)
# on port 7997 with the peer venv's infinity_emb ($INFINITY), waits until it answers, and
# leaves its pid in PID (the caller's trap stops it).
start_infinity() {
  local peer_dir log
  peer_dir="$(realpath -m "$WORK/$2-onnx")"
  log="$WORK/infinity-$2.log"
  if [ ! -f "$peer_dir/onnx/model.onnx" ]; then
    "$(dirname "$INFINITY")/python" scripts/peer_onnx.py "$1" "$peer_dir"
  fi
  HF_HUB_OFFLINE=1 INFINITY_ANONYMOUS_USAGE_STATS=0 DO_NOT_TRACK=1 "$INFINITY" v2 \
    --model-id "$peer_dir" --engine optimum --no-onnx-disable-optimize --device cpu \
    --port 7997 > "$log" 2>&1 &
  PID=$!
  echo "waiting for infinity-emb (optimum) on port 7997 ..."
  until curl -sf http://127.0.0.1:7997/health > /dev/null; do
    kill -0 "$PID" || { tail "$log"; exit 1; }
    sleep 1
  done
}
