"""How many times each thread of a running server sleeps and wakes for one lone request:
its threads' voluntary context switches (/proc/PID/task/TID/status), read before and
after N requests sent one after another, less what the same threads do idle over as
long (timers, the supervisor's pings), divided by N; and each process's CPU per request,
in user space and in the kernel (/proc/PID/stat), less its idle share the same way.

    python scripts/count_wakeups.py URL N PID [PID ...]   # a markdown table on stdout

A thread that blocks (a socket read, a queue, a lock, a sleep) and is woken counts one
switch per wake; one that runs on without blocking counts none, so the table says where
a lone request hands itself from one thread or process to another.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit


def switches(pids: list[int]) -> dict[tuple[int, str], int]:
    """Voluntary context switches of every thread of `pids`, by (pid, thread): its main
    thread, else the thread's id (Python names its threads only in its own memory)."""
    out: dict[tuple[int, str], int] = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                status = (task / "status").read_text()
            except OSError:
                continue  # a thread that ended meanwhile
            n = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
            out[pid, "main" if task.name == str(pid) else f"thread {task.name}"] = n
    return out


def cpu(pids: list[int]) -> dict[tuple[int, str], int]:
    """Clock ticks each process spent in user space and in the kernel (its threads')."""
    out = {}
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[(pid, "user")], out[(pid, "kernel")] = int(fields[11]), int(fields[12])
    return out


def delta(before: dict, after: dict) -> dict:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


def main(url: str, n: int, pids: list[int]) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port)
    body = json.dumps({"inputs": "word " * 120})  # 128 tokens with the special ones

    def send() -> None:
        conn.request("POST", parts.path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status

    for _ in range(200):  # warm-up
        send()
    t0, before, ticks = time.monotonic(), switches(pids), cpu(pids)
    for _ in range(n):
        send()
    elapsed, busy, used = (
        time.monotonic() - t0,
        delta(before, switches(pids)),
        delta(ticks, cpu(pids)),
    )
    before, ticks = switches(pids), cpu(pids)
    time.sleep(elapsed)  # the same threads, as long, with no request
    idle, resting = delta(before, switches(pids)), delta(ticks, cpu(pids))
    names = {pid: Path(f"/proc/{pid}/cmdline").read_text().split("\0")[2] for pid in pids}
    print(f"{n} lone requests to {url}, {elapsed / n * 1e3:.2f} ms each (one after another)\n")
    print("| process | thread | wake-ups per request |")
    print("|---|---|---:|")
    total = 0.0
    for key in sorted(busy):
        per = (busy[key] - idle.get(key, 0)) / n
        if per >= 0.05:
            total += per
            print(f"| {names[key[0]]} | {key[1]} | {per:.2f} |")
    print(f"| all | | {total:.2f} |")
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    print("\n| process | CPU ms per request, user | kernel |")
    print("|---|---:|---:|")
    for pid in pids:
        user, kernel = (
            (used[(pid, k)] - resting[(pid, k)]) * tick_ms / n for k in ("user", "kernel")
        )
        print(f"| {names[pid]} | {user:.2f} | {kernel:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), [int(p) for p in sys.argv[3:]])
