#!/usr/bin/env bash
# Wake-ups of a lone request (scripts/count_wakeups.py): our server on the simulated inf2
# NeuronCore serving BERT-base (scripts/inferentia_sim_env.sh; run
# scripts/benchmark_inferentia_sim.sh once first, it compiles the model), N (default
# 2000) lone /embed requests of 128 tokens; the table goes to stdout. REV=<revision>
# runs that revision instead, from the worktree scripts/benchmark_revisions.sh made of it
# (on its own workers: a revision from before they were the only ones is asked for them).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/inferentia_sim_env.sh
. scripts/inferentia_sim_env.sh
[ -f "$SIM/bert-neuronx/manifest.json" ] || { echo "run scripts/benchmark_inferentia_sim.sh first (it compiles $SIM/bert-neuronx)" >&2; exit 2; }
PORT=${PORT:-3198}
if [ -n "${REV:-}" ]; then
  TREE=$ROOT/.bench/revision-$(git rev-parse --short "$REV")
  [ -d "$TREE" ] || git worktree add --detach "$TREE" "$REV"
  export PYTHONPATH=$TREE:$PYTHONPATH
fi
RUN=$(mktemp -d)
trap '"$ROOT/.venv/bin/neuronserve" serve front --stop --run-dir "$RUN/front" >/dev/null 2>&1 || true; rm -rf "$RUN"' EXIT
(cd "$RUN" && "$ROOT/.venv/bin/neuronserve" serve front "$SIM/bert-neuronx" --port "$PORT" \
  --run-dir "$RUN/front" ${REV:+--engine native} >/dev/null)
echo "$(git rev-parse --short "${REV:-HEAD}"), $(date -u +%Y-%m-%dT%H:%MZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs"
echo
# shellcheck disable=SC2046
.venv/bin/python scripts/count_wakeups.py "http://127.0.0.1:$PORT/embed" "${N:-2000}" \
  $(pgrep -f "$RUN/front" | tr '\n' ' ')
