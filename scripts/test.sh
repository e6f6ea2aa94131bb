#!/usr/bin/env bash
# The whole test suite: lint (ruff), format check, types (mypy), the documentation site
# (mkdocs build --strict: its reference pages are generated from the code), then every
# test folder (real TorchServe and tritonserver processes included), then the container
# tier (tests/containers: the images built and run with docker), timed on its own line.
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
# the container tier builds and runs the images with docker (an engine it starts itself
# when none runs) on a base it makes with debootstrap
if ! command -v docker >/dev/null || ! command -v debootstrap >/dev/null; then
  step "docker and debootstrap, for the container tier"
  apt-get install -y -qq docker.io debootstrap >/dev/null 2>&1 || echo "docker not installed"
fi
.venv/bin/ruff check neuronserve handlers triton_backend tests scripts docs
.venv/bin/ruff format --check neuronserve handlers triton_backend tests scripts docs
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir .site
# Three processes share the two cores: the server tests spend much of their time waiting
# for servers to start and stop. Each file runs whole in one process (its servers are
# shared by its tests), in the order collected: the slowest first (tests/conftest.py).
# mypy (half a minute of one core) checks types beside them; its verdict comes at the end.
# The slowest 25 tests are listed after the run: where the suite's time goes.
types_log=$(mktemp)
.venv/bin/mypy >"$types_log" 2>&1 &
types_pid=$!
tests=0
started=$SECONDS
.venv/bin/python -m pytest -v -n 3 --dist loadfile --no-loadscope-reorder \
  --hypothesis-profile=thorough --durations=25 --ignore=tests/containers "$@" || tests=$?
echo "tests: $((SECONDS - started)) s"
types=0
wait "$types_pid" || types=$?
echo "mypy: $(cat "$types_log")"
rm -f "$types_log"
# the container tier, on its own: images built and run for real (minutes of its own);
# the whole suite only (arguments pick tests of the other tiers)
containers=0
if [ $# -eq 0 ]; then
  started=$SECONDS
  .venv/bin/python -m pytest -v tests/containers || containers=$?
  echo "container tier: $((SECONDS - started)) s"
fi
exit $((tests != 0 ? tests : types != 0 ? types : containers))
