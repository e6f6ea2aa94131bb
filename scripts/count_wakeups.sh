#!/usr/bin/env bash
# Wake-ups of a lone request (scripts/count_wakeups.py): our server on the simulated inf2
# NeuronCore serving BERT-base (scripts/inferentia_sim_env.sh; run
# scripts/benchmark_inferentia_sim.sh once first, it compiles the model), N (default
# 2000) lone /embed requests of 128 tokens; the table goes to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/inferentia_sim_env.sh
. scripts/inferentia_sim_env.sh
[ -f "$SIM/bert-neuronx/manifest.json" ] || { echo "run scripts/benchmark_inferentia_sim.sh first (it compiles $SIM/bert-neuronx)" >&2; exit 2; }
PORT=${PORT:-3198}
RUN=$(mktemp -d)
trap '"$ROOT/.venv/bin/neuronserve" serve front --stop --run-dir "$RUN/front" >/dev/null 2>&1 || true; rm -rf "$RUN"' EXIT
(cd "$RUN" && "$ROOT/.venv/bin/neuronserve" serve front "$SIM/bert-neuronx" --port "$PORT" \
  --run-dir "$RUN/front" >/dev/null)
echo "$(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs"
echo
# shellcheck disable=SC2046
.venv/bin/python scripts/count_wakeups.py "http://127.0.0.1:$PORT/embed" "${N:-2000}" \
  $(pgrep -f "$RUN/front" | tr '\n' ' ')
