"""`wrk`, a load generator written in C that shares nothing with ours: it drives the
bench's HTTP points where it is installed (`--generator`), and cross-checks one point
measured by ours otherwise. Its own CPU time is measured (the children's rusage), so the
report says what share of the machine the load generator took from the server."""

from __future__ import annotations

import json
import re
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}
# the line the Lua `done` hook prints: every figure the bench reports, in microseconds
_MARK = "NSWRK "
_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('%s{"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, '
    .. '"p95_us": %d, "p99_us": %d, "max_us": %d, "mean_us": %f, "connect": %d, "read": %d, '
    .. '"write": %d, "status": %d, "timeout": %d}\\n', "MARK", summary.requests,
    summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(95),
    latency:percentile(99), latency.max, latency.mean, e.connect, e.read, e.write, e.status,
    e.timeout))
end
""".replace("MARK", _MARK)


@dataclass(frozen=True)
class WrkRequest:
    """What wrk sends on every connection: one POST, its body as bytes (binary tensors
    included)."""

    url: str
    body: bytes
    headers: dict[str, str]


def available() -> bool:
    return shutil.which("wrk") is not None


def _ms(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(f"cannot read wrk time {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse(output: str) -> dict[str, Any]:
    """wrk's summary: the `done` hook's figures where it printed them, else its text."""
    for line in output.splitlines():
        if line.startswith(_MARK):
            return _from_done(json.loads(line[len(_MARK) :]))
    rate = re.search(r"Requests/sec:\s+([0-9.]+)", output)
    if not rate:
        raise ValueError(f"wrk printed no Requests/sec:\n{output}")
    result: dict[str, Any] = {"req_per_s": float(rate.group(1))}
    total = re.search(r"(\d+) requests in", output)
    if total:
        result["requests"] = int(total.group(1))
    for pct, key in (("50", "p50_ms"), ("90", "p90_ms"), ("99", "p99_ms")):
        m = re.search(rf"^\s+{pct}%\s+(\S+)", output, re.M)
        if m:
            result[key] = _ms(m.group(1))
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    result["non_2xx"] = int(errors.group(1)) if errors else 0
    return result


def _from_done(d: dict[str, Any]) -> dict[str, Any]:
    wall_s = d["duration_us"] / 1e6
    # wrk counts a non-2xx answer among its requests, and a socket error apart
    ok = d["requests"] - d["status"]
    out: dict[str, Any] = {
        "requests": ok,
        "wall_s": wall_s,
        "req_per_s": ok / wall_s if wall_s > 0 else 0.0,
        "non_2xx": d["status"],
        "socket_errors": d["connect"] + d["read"] + d["write"] + d["timeout"],
        "mean_ms": d["mean_us"] / 1e3,
    }
    for key in ("p50", "p90", "p95", "p99", "max"):
        out[f"{key}_ms"] = d[f"{key}_us"] / 1e3
    return out


def _lua_string(s: str) -> str:
    return "[==[" + s + "]==]"


def run_wrk(request: WrkRequest, concurrency: int, duration_s: float) -> dict[str, Any]:
    """POST `request` from `concurrency` connections on one wrk thread for `duration_s`
    (whole seconds, at least one); its summary and `cpu_s`, the CPU time wrk used."""
    with tempfile.TemporaryDirectory(prefix="ns-wrk-") as tmp:
        body = Path(tmp) / "body"
        body.write_bytes(request.body)
        script = [
            'wrk.method = "POST"',
            f'local f = io.open({_lua_string(str(body))}, "rb")',
            "wrk.body = f:read('*a')",
            "f:close()",
        ]
        for k, v in request.headers.items():
            # spaces inside the brackets: "[[" would open a Lua long string
            script.append(f"wrk.headers[ {_lua_string(k)} ] = {_lua_string(v)}")
        lua = Path(tmp) / "post.lua"
        lua.write_text("\n".join(script) + "\n" + _DONE)
        seconds = max(1, round(duration_s))
        # wrk's own 2 s timeout would count a slow answer (a large batch behind a queue of
        # them) as an error; bench's closed loop waits for every answer
        cmd = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", f"--timeout={seconds + 60}s"]
        cmd += ["-s", str(lua), request.url]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr or out.stdout}")
    result = parse(out.stdout)
    result["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result["command"] = " ".join([*cmd[:-3], "post.lua", request.url])
    return result
