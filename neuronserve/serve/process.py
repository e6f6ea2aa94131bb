"""What both launchers need from the OS: pid files, process trees, waiting until gone."""

from __future__ import annotations

from pathlib import Path

import psutil


class ServeError(RuntimeError):
    """The server could not be started, became unhealthy, or could not be stopped."""


def live_pid(pid_file: Path) -> int | None:
    """The pid in `pid_file` if that process is alive (a zombie is not)."""
    try:
        pid = int(Path(pid_file).read_text().strip())
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return pid
    except (OSError, ValueError, psutil.NoSuchProcess):
        pass
    return None


def process_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> None:
    """Wait for `procs` to exit; kill what is left after `timeout_s`, then reap."""
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)
