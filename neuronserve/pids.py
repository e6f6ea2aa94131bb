"""Whether a process runs: the one answer every part asks (a pid file's server, a
catalog's worker, a core lease's holder)."""

from __future__ import annotations

import psutil


def alive(pid: int | str | None) -> bool:
    """Whether process `pid` runs: exists and is not a zombie (a killed child its parent
    has not reaped yet still shows in /proc). A process of another user counts."""
    try:
        number = int(str(pid))
        return number > 0 and psutil.Process(number).status() != psutil.STATUS_ZOMBIE
    except (ValueError, psutil.Error):
        return False
