"""What the launchers need from the OS: pid files, process trees, stopping a tree and
waiting until it is gone, free loopback ports."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
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
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=10)


def stop_tree(pid: int, ask: Callable[[], object], timeout_s: float) -> int:
    """Stop the process `pid` and everything it started: `ask` it to stop (a signal, the
    server's own stop command), wait up to `timeout_s`, kill what is left. Returns how
    many processes the tree held besides `pid`."""
    procs = process_tree(pid)
    ask()
    wait_gone(procs, timeout_s)
    return max(len(procs) - 1, 0)


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports free at the moment of asking."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
