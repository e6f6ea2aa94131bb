"""What a tritonserver's Python-backend stub processes tell: which are alive, for which
model, and what they leave behind when killed. The server control (triton.py), its
healer (triton_healer.py) and readiness all count instances here."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import psutil

STUB = "triton_python_backend_stub"


def live_stubs(server_pid: int) -> dict[str, list[psutil.Process]]:
    """The live (not zombie) Python-backend stubs of the tritonserver `server_pid`, by
    model: a stub's first argument is its model's `<repository>/<model>/<version>/model.py`."""
    out: dict[str, list[psutil.Process]] = {}
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.Error:
        return out
    for p in children:
        try:
            cmd = p.cmdline()
            if not cmd or not cmd[0].endswith(STUB) or p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if len(cmd) > 1:
            out.setdefault(Path(cmd[1]).parent.parent.name, []).append(p)
    return out


@dataclass(frozen=True)
class Count:
    alive: int
    expected: int

    @property
    def whole(self) -> bool:
        return self.alive >= self.expected


# what Triton's Python backend leaves behind when a stub or the server is killed: each
# stub's shared-memory region (named in its command line) and the backend's environment
# folder (a fixed /tmp path, so TMPDIR cannot move it)
LEFTOVERS_FILE = "leftovers.json"
_LEFTOVER_PREFIXES = ("/dev/shm/triton_python_backend_shm_region_", "/tmp/python_env_")


def stub_regions(stubs: dict[str, list[psutil.Process]]) -> set[str]:
    """The shared-memory regions of `stubs` (as live_stubs gives them)."""
    regions = set()
    for processes in stubs.values():
        for p in processes:
            with contextlib.suppress(psutil.Error, IndexError):
                regions.add("/dev/shm/" + p.cmdline()[2])
    return regions


def note_leftovers(run_dir: Path, paths: set[str]) -> None:
    """Add `paths` to what `remove_leftovers` deletes once the server is gone."""
    path = Path(run_dir) / LEFTOVERS_FILE
    known = set(json.loads(path.read_text())) if path.is_file() else set()
    if not paths <= known:
        path.write_text(json.dumps(sorted(known | paths)))


def remove_leftovers(run_dir: Path) -> list[str]:
    """Delete what this server's killed stubs or killed server left; returns the paths."""
    path = Path(run_dir) / LEFTOVERS_FILE
    removed = []
    for p in json.loads(path.read_text()) if path.is_file() else []:
        if not p.startswith(_LEFTOVER_PREFIXES) or not os.path.lexists(p):
            continue
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(p)
        removed.append(p)
    path.unlink(missing_ok=True)
    return removed


def instance_counts(server_pid: int, expected: dict[str, int]) -> dict[str, Count]:
    """Each model's live stubs of the `expected` instance count (its config's, which
    `serve triton` read when it started the server)."""
    return counts_from_stubs(live_stubs(server_pid), expected)


def counts_from_stubs(
    stubs: dict[str, list[psutil.Process]], expected: dict[str, int]
) -> dict[str, Count]:
    return {m: Count(len(stubs.get(m, [])), n) for m, n in expected.items()}
