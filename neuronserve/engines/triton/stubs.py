"""What a tritonserver's Python-backend stub processes tell: which are alive, for which
model, and what they leave behind when killed. The server control (triton.py), its
healer (healer.py) and readiness all count instances here."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import psutil

from ...worker import core_group_name

STUB = "triton_python_backend_stub"
# a stub's command line: the stub, model.py, its shared-memory region, ..., its instance
_MODEL_PY_ARG, REGION_ARG, _INSTANCE_ARG = 1, 2, 8


# One instance group per core group, named after it, with a host policy of its own:
# Triton's in-place instance update (a load whose config differs only in instance_group)
# tells instances apart by their group's settings (kind, devices, host policy), not by
# the group's name. Measured on tritonserver 2.51: two groups that differed only in name,
# one stub killed, reloading without the dead one's group removed the live instance and
# kept the dead one; with a host policy each, exactly the dead one went and the other
# served on. So a dead instance is replaced alone (healer.py).
def core_group_config(index: int) -> tuple[str, str]:
    """(instance group name, host policy) of core group `index`'s instance group."""
    return core_group_name(index), core_group_name(index)


def instance_of(stub: psutil.Process) -> str:
    """The Triton instance (`<group>_<index>`) a stub process serves ("" if unknown)."""
    try:
        cmd = stub.cmdline()
    except psutil.Error:
        return ""
    return cmd[_INSTANCE_ARG] if len(cmd) > _INSTANCE_ARG else ""


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
        if len(cmd) > _MODEL_PY_ARG:
            out.setdefault(Path(cmd[_MODEL_PY_ARG]).parent.parent.name, []).append(p)
    return out


def orphaned_stubs(server_pid: int) -> list[psutil.Process]:
    """The stubs of the tritonserver `server_pid` still running after it died: they keep
    its process group (it led a session of its own) and their core leases, and would keep
    a new server's instances from loading. Only for a server that is gone: a live one's
    stubs are in the same group."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or [""]
            if cmd[0].endswith(STUB) and os.getpgid(p.pid) == server_pid:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def kill_orphans(server_pid: int) -> int:
    """Kill `orphaned_stubs(server_pid)`, wait until they are gone; how many there were."""
    orphans = orphaned_stubs(server_pid)
    for p in orphans:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(orphans, timeout=10)
    return len(orphans)


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
                regions.add("/dev/shm/" + p.cmdline()[REGION_ARG])
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
    stubs = live_stubs(server_pid)
    return {m: Count(len(stubs.get(m, [])), n) for m, n in expected.items()}
