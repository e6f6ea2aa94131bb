#!/usr/bin/env bash
# A grid tuned from traffic against compile's default, on the simulated NeuronCore (the
# Neuron stand-in's device-time mode: one inf2 NeuronCore, BERT-base's published times):
# BERT-base (random weights) compiled for neuronx over the default grid (batch 1, 4, 8 x
# 16, 32, 64, 128 tokens), `neuronserve tune --texts` on a fixed, skewed length
# distribution with --apply (the same budget: 12 buckets, at most 128 tokens), then our
# server on each artifact in turn, the same texts one per request to /embed under wrk,
# rounds alternating. Run it on a 2-CPU machine, nothing else running.
#
#   scripts/benchmark_tuned_grid.sh          # in benchmarks/tuned-grid/
#
# RUNS, CONC, DURATION, OUT override.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/inferentia_sim_env.sh
. scripts/inferentia_sim_env.sh
[ -x .venv/bin/neuronserve ] || scripts/install.sh
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 2; }
OUT=$(realpath -m "${OUT:-benchmarks/tuned-grid}")
mkdir -p "$OUT"
[ -f "$SIM/bert-base/config.json" ] || .venv/bin/python scripts/random_model.py \
  bert-base "$SIM/bert-base" --task feature-extraction
# compiled in device-time mode, so the bucket times it records are the device's
[ -f "$SIM/bert-default/manifest.json" ] || .venv/bin/neuronserve compile \
  --model "$SIM/bert-base" --task feature-extraction --target neuronx --out "$SIM/bert-default"
.venv/bin/python scripts/tuned_grid.py texts "$OUT/texts.txt"
rm -rf "$SIM/bert-tuned"
.venv/bin/neuronserve tune "$SIM/bert-default" --texts "$OUT/texts.txt" \
  --apply "$SIM/bert-tuned" --source "$SIM/bert-base" | grep -v "^  bucket" | tee "$OUT/tune.txt"
.venv/bin/python scripts/tuned_grid.py run "$SIM/bert-default" "$SIM/bert-tuned" \
  "$OUT/texts.txt" "$OUT" | tee "$OUT/summary.md"
