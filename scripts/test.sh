#!/usr/bin/env bash
# The whole test suite, real TorchServe servers included (a few minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
.venv/bin/ruff check neuronserve handlers triton_backend tests scripts
exec .venv/bin/python -m pytest -v "$@"
