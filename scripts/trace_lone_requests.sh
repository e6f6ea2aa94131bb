#!/usr/bin/env bash
# Where a lone request's time goes, read from its trace: our server
# serving BERT-base on the simulated inf2 NeuronCore (scripts/inferentia_sim_env.sh), every
# request traced to scripts/otlp_sink.py, N (default 300) lone /embed requests one after
# another after a warm-up; the medians of each span's start and length, into
# benchmarks/inferentia-sim-engines/lone-request-trace.md (OUT overrides). Tracing is on,
# so each figure includes its span's own cost.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/inferentia_sim_env.sh
. scripts/inferentia_sim_env.sh
[ -f "$SIM/bert-neuronx/manifest.json" ] || { echo "run scripts/benchmark_inferentia_sim.sh first (it compiles $SIM/bert-neuronx)" >&2; exit 2; }
OUT=$(realpath -m "${OUT:-benchmarks/inferentia-sim-engines/lone-request-trace.md}")
PORT=${PORT:-4397} FRONT=${FRONT:-3197}
RUN=$(mktemp -d)
trap 'rm -rf "$RUN"' EXIT
.venv/bin/python scripts/otlp_sink.py "$PORT" "$RUN/spans.txt" "$RUN/stages.md" &
SINK=$!
(cd "$RUN" && "$ROOT/.venv/bin/neuronserve" serve front "$SIM/bert-neuronx" \
  --port "$FRONT" --run-dir "$RUN/front" --otlp-endpoint "http://127.0.0.1:$PORT" >/dev/null)
.venv/bin/python - "$FRONT" "${N:-300}" <<'PY'
import sys, time, requests
url, n = f"http://127.0.0.1:{sys.argv[1]}/embed", int(sys.argv[2])
body = {"inputs": "word " * 120}  # 128 tokens with the special ones
with requests.Session() as s:
    end = time.monotonic() + 3  # warm-up, not traced apart: the medians take it in
    while time.monotonic() < end:
        s.post(url, json=body).raise_for_status()
    for _ in range(n):
        s.post(url, json=body).raise_for_status()
PY
"$ROOT/.venv/bin/neuronserve" serve front --stop --run-dir "$RUN/front" >/dev/null
kill "$SINK"; wait "$SINK" || true
{
  echo "## A lone request's spans, our server, simulated inf2 NeuronCore"
  echo
  echo "$(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), ${N:-300} lone /embed requests of 128 tokens after 3 s of warm-up; $(cat "$RUN/spans.txt") spans received."
  echo
  cat "$RUN/stages.md"
} > "$OUT"
cat "$OUT"
