#!/usr/bin/env bash
# What traces cost, by simulation: the front on the native engine serving BERT-base on
# the simulated inf2 NeuronCore (as scripts/benchmark_inferentia_sim.sh sets it up), with
# traces off and on (every request traced, through OpenTelemetry's own variables, and
# exported over OTLP/gRPC to scripts/otlp_sink.py, which only counts the spans), RUNS
# rounds (default 3) in alternating order, into benchmarks/inferentia-sim-tracing/.
# Whether the code of traces costs anything while they are off is the other question:
# scripts/benchmark_inferentia_sim.sh BASE NEW with ENDPOINTS="native=front-native".
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/inferentia_sim_env.sh
. scripts/inferentia_sim_env.sh
[ -f "$SIM/bert-neuronx/manifest.json" ] || { echo "run scripts/benchmark_inferentia_sim.sh first (it compiles $SIM/bert-neuronx)" >&2; exit 2; }
OUT=$(realpath -m "${OUT:-benchmarks/inferentia-sim-tracing}")
rm -rf "$OUT" && mkdir -p "$OUT"
PORT=${PORT:-4399}
.venv/bin/python scripts/otlp_sink.py "$PORT" "$OUT/spans.txt" &
SINK=$!
trap 'kill $SINK 2>/dev/null || true' EXIT
one() {  # $1: off or on, $2: round; the summary's "new" is traces on, "base" off
  local dir; dir=$([ "$1" = on ] && echo new || echo base)
  local env=(env -u OTEL_EXPORTER_OTLP_ENDPOINT)
  [ "$1" = on ] && env=(env OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$PORT" OTEL_EXPORTER_OTLP_PROTOCOL=grpc)
  (cd "$SIM" && "${env[@]}" "$ROOT/.venv/bin/neuronserve" bench --title "round $2, traces $1" \
    -e "native=front-native:$SIM/bert-neuronx" --generator wrk --sequence-lengths 128 \
    --concurrency "${CONC:-1,16,64}" --warmup 2 --duration "${DURATION:-4}" --server-warmup 10 \
    --out "$OUT/$dir-$2")
}
for r in $(seq 1 "${RUNS:-3}"); do
  if [ $((r % 2)) = 1 ]; then one off "$r"; one on "$r"; else one on "$r"; one off "$r"; fi
done
kill $SINK; wait $SINK || true
trap - EXIT
.venv/bin/python scripts/inferentia_sim_summary.py "$OUT" "traces on" "traces off" > "$OUT/inferentia.md"
echo "spans received: $(cat "$OUT/spans.txt")" >> "$OUT/inferentia.md"
cat "$OUT/inferentia.md"
