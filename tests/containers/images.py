"""What the container tier's tests share: the docker CLI, as its users run it."""

from __future__ import annotations

import subprocess


def docker(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=check, timeout=timeout
    )
