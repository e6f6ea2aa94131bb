#!/usr/bin/env bash
# The whole test suite: lint (ruff), format check, types (mypy), the documentation site
# (mkdocs build --strict: its reference pages are generated from the code), then every
# test folder (real TorchServe and tritonserver processes included).
# Pieces: `pytest tests/unit` (under a minute, before every commit), `pytest tests/compile`
# (compiles real models in every precision), `pytest tests/neuron` (the Neuron path against
# the SDK stand-in), `pytest tests/servers` (starts real servers); add `-n 3` to any.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
# the client libraries whose use the clients guide shows (its snippets run as tests)
step() { echo "install: $*"; }
step "the client libraries of the clients guide (LangChain, LlamaIndex, Haystack, LiteLLM)"
.venv/bin/python -m pip install -qq -e ".[clients]"
# wrk cross-checks the benchmark's load generator; without it that test checks the skip
command -v wrk >/dev/null || apt-get install -y -qq wrk >/dev/null 2>&1 || echo "wrk not installed"
.venv/bin/ruff check neuronserve handlers triton_backend tests scripts docs
.venv/bin/ruff format --check neuronserve handlers triton_backend tests scripts docs
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir .site
# Three processes share the two cores: the server tests spend much of their time waiting
# for servers to start and stop. Each file runs whole in one process (its servers are
# shared by its tests), in the order collected: the slowest first (tests/conftest.py).
# mypy (half a minute of one core) checks types beside them; its verdict comes at the end.
types_log=$(mktemp)
.venv/bin/mypy >"$types_log" 2>&1 &
types_pid=$!
tests=0
.venv/bin/python -m pytest -v -n 3 --dist loadfile --no-loadscope-reorder \
  --hypothesis-profile=thorough "$@" || tests=$?
types=0
wait "$types_pid" || types=$?
echo "mypy: $(cat "$types_log")"
rm -f "$types_log"
exit $((tests != 0 ? tests : types))
