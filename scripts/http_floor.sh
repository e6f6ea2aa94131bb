#!/usr/bin/env bash
# The floor under a lone request on this host, without our server (scripts/http_floor.py):
# uvicorn (httptools, uvloop, as the front runs) answering a bare POST; the same with the
# body parsed, tokenized (the tokenizers library, the simulation's tokenizer and 128-token
# text) and a call of the simulated device's 1.00 ms on a thread, in one process; the
# same across two processes over a unix socket, as our front and worker are; and our own
# server on the simulated NeuronCore. N wrk rounds of 5 s at one client each (with wrk's
# own CPU share); then the tokenizer alone, hot and after 2 ms idle. What a
# lone request costs beyond these is our server's own (BENCHMARKS, "The floor under a
# lone request").
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 2; }
# shellcheck source=scripts/inferentia_sim_env.sh
. scripts/inferentia_sim_env.sh
[ -f "$SIM/bert-neuronx/tokenizer.json" ] || {
  echo "no simulated artifact: run scripts/benchmark_inferentia_sim.sh first" >&2; exit 2; }
PORT=${PORT:-3331}
RUN=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true
  "$ROOT/.venv/bin/neuronserve" serve front --stop --run-dir "$RUN/front" >/dev/null 2>&1 || true
  rm -rf "$RUN"' EXIT
export FLOOR_TOKENIZER=$SIM/bert-neuronx/tokenizer.json FLOOR_SOCK=$RUN/worker.sock
PY=$ROOT/.venv/bin/python
BODY=$(python3 -c 'import json; print(json.dumps({"inputs": "word " * 120}))')
echo "wrk.method = 'POST'; wrk.body = '$BODY'; wrk.headers['Content-Type'] = 'application/json'" \
  > "$RUN/post.lua"
echo "$(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs"
floor() {  # name, FLOOR_MODE, FLOOR_VIA_LOOP
  if [ "$2" = two-process ]; then
    FLOOR_MODE=$2 FLOOR_VIA_LOOP=$3 "$PY" scripts/http_floor.py & PIDS+=($!)
    for _ in $(seq 50); do [ -S "$FLOOR_SOCK" ] && break; sleep 0.1; done
  fi
  FLOOR_MODE=$2 "$PY" -m uvicorn --app-dir scripts http_floor:app --port "$PORT" \
    --http httptools --loop uvloop --log-level warning & PIDS+=($!)
  for _ in $(seq 50); do curl -sf -o /dev/null -d "$BODY" "http://127.0.0.1:$PORT/" && break; sleep 0.1; done
  rounds "$1" "http://127.0.0.1:$PORT/"
  kill "${PIDS[@]}"; wait "${PIDS[@]}" 2>/dev/null || true; PIDS=(); rm -f "$FLOOR_SOCK"
}
rounds() {  # name, url: wrk's p50 at one client, and its own CPU share of the round
  wrk -t1 -c1 -d2s -s "$RUN/post.lua" "$2" >/dev/null
  for i in $(seq "${N:-3}"); do
    TIMEFORMAT=%P
    { time wrk -t1 -c1 -d5s --latency -s "$RUN/post.lua" "$2" > "$RUN/wrk.txt"; } 2> "$RUN/cpu.txt"
    echo "$1, one client, round $i: p50 $(awk '$1 == "50%" {print $2}' "$RUN/wrk.txt")" \
      "(wrk's CPU $(cat "$RUN/cpu.txt")% of one core)"
  done
}
floor "bare uvicorn app" bare ""
floor "one process: tokenize, device thread" one-process ""
floor "two processes: the device thread writes the answer" two-process ""
floor "two processes: the worker's loop writes the answer" two-process 1
(cd "$RUN" && "$ROOT/.venv/bin/neuronserve" serve front "$SIM/bert-neuronx" --port "$PORT" \
  --run-dir "$RUN/front" >/dev/null)
rounds "our server, /embed" "http://127.0.0.1:$PORT/embed"
"$ROOT/.venv/bin/neuronserve" serve front --stop --run-dir "$RUN/front" >/dev/null
"$PY" - "$FLOOR_TOKENIZER" <<'PY'
import sys, time
from tokenizers import Tokenizer

tok = Tokenizer.from_file(sys.argv[1])
tok.no_padding()
tok.no_truncation()
text = "word " * 120
for idle in (0.0, 0.002):
    took = []
    for _ in range(1000):
        if idle:
            time.sleep(idle)
        t0 = time.perf_counter()
        tok.encode_batch_fast([text])
        took.append(time.perf_counter() - t0)
    took.sort()
    print(f"tokenizing the 128-token text, {idle * 1e3:g} ms idle before: p50 {took[500] * 1e6:.0f} us")
PY
