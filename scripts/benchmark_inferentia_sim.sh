#!/usr/bin/env bash
# Inferentia by simulation: two revisions of neuronserve (scripts/benchmark_revisions.sh)
# serving BERT-base (random weights) compiled for neuronx, on a fake host of one
# NeuronCore whose calls take the time AWS publishes for inf2 (the Neuron stand-in's
# device-time mode, tests/neuron_standin), 128-token texts, through the front (its
# /invocations, /embed and /v1/embeddings). bench records each point's NeuronCore utilization from the
# stand-in's neuron-monitor and the host's CPU per request. Run it on a 2-CPU machine
# (an inf2.xlarge has 2 vCPUs per NeuronCore), nothing else running.
#
#   scripts/benchmark_inferentia_sim.sh <BASE> [NEW, default HEAD]   # in benchmarks/inferentia-sim/
#
# What is simulated and what only hardware can confirm: BENCHMARKS.md, "Inferentia by
# simulation". CONC, RUNS, OUT override.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/inferentia_sim_env.sh
. scripts/inferentia_sim_env.sh
[ -x .venv/bin/neuronserve ] || scripts/install.sh
[ -f "$SIM/bert-base/config.json" ] || .venv/bin/python scripts/random_model.py \
  bert-base "$SIM/bert-base" --task feature-extraction
# compiled in device-time mode, so the bucket times it records are the device's
[ -f "$SIM/bert-neuronx/manifest.json" ] || .venv/bin/neuronserve compile \
  --model "$SIM/bert-base" --task feature-extraction --target neuronx \
  --batch-sizes 1,2,4,8,16 --sequence-lengths 128 --out "$SIM/bert-neuronx"
[ $# -ge 1 ] || { echo "usage: scripts/benchmark_inferentia_sim.sh <BASE> [NEW, default HEAD]" >&2; exit 2; }
OUT=$(realpath -m "${OUT:-benchmarks/inferentia-sim}")
ART=$SIM/bert-neuronx SEQ=128 CONC=${CONC:-1,16,32,64} OUT=$OUT scripts/benchmark_revisions.sh "$@"
.venv/bin/python scripts/inferentia_sim_summary.py "$OUT" "$(git rev-parse --short "${2:-HEAD}")" \
  "$(git rev-parse --short "$1")" > "$OUT/inferentia.md"
cat "$OUT/inferentia.md"
