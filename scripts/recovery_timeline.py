"""Where a TorchServe worker's recovery goes: serve ARTIFACT with TorchServe (two workers),
soak it with one worker SIGKILLed under load, then read TorchServe's own log for the
replacement's steps and print them as seconds after the kill.

    .venv/bin/python scripts/recovery_timeline.py ARTIFACT [REQUESTS]

The steps: TorchServe notices the dead worker, waits its retry delay, starts a Python
worker, that worker connects, neuronserve's handler leases a core group and is ready
(its `neuronserve:` line says after how long), TorchServe marks the worker loaded.
"""

from __future__ import annotations

import re
import sys
from datetime import datetime
from pathlib import Path

from neuronserve.bench.soak import SoakOptions, format_report, run_soak, start_target

STEPS = [
    ("TorchServe notices the worker died", "Worker disconnected"),
    ("TorchServe schedules the restart", "Retry worker"),
    ("the new Python worker listens", "Listening on port"),
    ("TorchServe's worker code is loaded", "Torch worker started"),
    ("the handler leased a core group and is ready", "neuronserve: pid"),
    ("TorchServe marks the worker loaded", "WORKER_STARTED -> WORKER_MODEL_LOADED"),
]
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{3})")


def main() -> int:
    artifact = Path(sys.argv[1])
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
    server, target = start_target(artifact, "torchserve", "engine")
    try:
        report = run_soak(SoakOptions(requests=requests), target, artifact)
        killed_wall = report.killed_at
        if killed_wall is None:
            print(format_report(report))
            return 1
        log = (Path(server.tmp.name) / "ts" / "logs" / "ts_log.log").read_text(errors="replace")
    finally:
        server.stop()
    print(format_report(report))
    print(f"\nthe replacement of worker pid {report.killed_pid}, from TorchServe's ts_log.log:")
    for label, mark in STEPS:
        for line in log.splitlines():
            m = _STAMP.match(line)
            if not m or mark not in line:
                continue
            at = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S,%f").timestamp()
            if at >= killed_wall - 0.5:
                detail = line.split(" - ", 1)[-1].strip()[:220]
                print(f"  +{at - killed_wall:6.2f} s  {label}: {detail}")
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
