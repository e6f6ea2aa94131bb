"""Cross-check one point with `wrk`, a load generator written in C that shares nothing
with ours: if the two disagree, ours is the bottleneck (or wrong)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def available() -> bool:
    return shutil.which("wrk") is not None


def _ms(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(f"cannot read wrk time {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse(output: str) -> dict[str, float]:
    rate = re.search(r"Requests/sec:\s+([0-9.]+)", output)
    if not rate:
        raise ValueError(f"wrk printed no Requests/sec:\n{output}")
    result = {"req_per_s": float(rate.group(1))}
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


def _lua_string(s: str) -> str:
    return "[==[" + s + "]==]"


def run_wrk(
    url: str, body: bytes, headers: dict[str, str], concurrency: int, duration_s: float
) -> dict[str, Any]:
    """POST `body` to `url` from `concurrency` connections on one wrk thread."""
    script = ['wrk.method = "POST"', f"wrk.body = {_lua_string(body.decode())}"]
    for k, v in headers.items():
        # spaces inside the brackets: "[[" would open a Lua long string
        script.append(f"wrk.headers[ {_lua_string(k)} ] = {_lua_string(v)}")
    with tempfile.TemporaryDirectory(prefix="ns-wrk-") as tmp:
        lua = Path(tmp) / "post.lua"
        lua.write_text("\n".join(script) + "\n")
        cmd = [
            "wrk",
            "-t1",
            f"-c{concurrency}",
            f"-d{max(1, round(duration_s))}s",
            "--latency",
            "-s",
            str(lua),
            url,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 120)
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr or out.stdout}")
    result: dict[str, Any] = {**parse(out.stdout)}
    result["command"] = " ".join([*cmd[:-3], "post.lua", url])
    return result
