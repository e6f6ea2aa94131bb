#!/usr/bin/env bash
# The whole test suite, real TorchServe servers included (a few minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
# wrk cross-checks the benchmark's load generator; without it that test checks the skip
command -v wrk >/dev/null || apt-get install -y -qq wrk >/dev/null 2>&1 || echo "wrk not installed"
.venv/bin/ruff check neuronserve handlers triton_backend tests scripts
exec .venv/bin/python -m pytest -v "$@"
