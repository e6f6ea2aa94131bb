"""What a worker holds: the one wanted set every worker follows, and for a multi-model
deployment the folder through which the front changes it.

A fixed deployment's wanted set is the models its packaged settings name, loaded before
the worker says it is ready (one that cannot load fails the worker's start). A
multi-model deployment's is the catalog folder: the front writes `wanted.json` ({worker
name: {"artifact", "truncation"}}) from its table of served models; every worker follows
it in a thread of its own: it loads what is new and drops what is gone, then writes
`worker-<core group>.json` ({"pid", "models": {name: "ready" | "failed: ..."}}). The same
`Follower.sync` loads and drops in both.

Loading happens inside the worker processes that already hold the core groups: on Neuron a
new process cannot reach a NeuronCore a live one holds ("Processes do not share
NeuronCores", https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/explore/core-allocation.html),
and one process may load many models onto its cores. A file rather than a request: the
servers (TorchServe, Triton) give no way to address one particular worker, and a worker
started later (a replacement) reads the same file and comes up holding the same models.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .pids import alive
from .private_folders import private_folder

log = logging.getLogger(__name__)

WANTED = "wanted.json"
READY = "ready"
FAILED = "failed: "
# how often a worker looks for a change
POLL_S = 0.05


def write_json(path: Path, value: Any) -> None:
    """Whole or not at all: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_wanted(folder: Path, models: dict[str, dict[str, Any]]) -> None:
    """What every worker is to hold: worker name -> {"artifact": path, "truncation"}."""
    private_folder(folder)
    write_json(folder / WANTED, models)


def wanted(folder: Path) -> dict[str, dict[str, Any]]:
    return read_json(folder / WANTED) or {}


def worker_file(folder: Path, group: int) -> Path:
    return folder / f"worker-{group}.json"


def worker_states(folder: Path) -> list[dict[str, Any]]:
    """What each live worker holds: [{"pid", "group", "models": {name: state}}]."""
    out = []
    for path in sorted(folder.glob("worker-*.json")):
        state = read_json(path)
        if isinstance(state, dict) and alive(int(state.get("pid", 0))):
            out.append(state)
    return out


class Follower:
    """A worker's models kept in step with its wanted set: `fixed` (a fixed deployment's
    packaged models), or the catalog `folder`'s `wanted.json`, followed in a thread.

    `load(name, artifact, truncation)` makes a model's Runner; `models()` and
    `replace(models)` read and swap the worker's models (a new dict each time, so a batch
    being served keeps the one it started with)."""

    def __init__(  # noqa: PLR0913 - where the wanted set is, and the worker's three hooks
        self,
        folder: Path | None,
        group: int,
        load: Callable[[str, str, bool | None], Any],
        models: Callable[[], dict[str, Any]],
        replace: Callable[[dict[str, Any]], None],
        fixed: dict[str, dict[str, Any]] | None = None,
    ):
        self.folder, self.group = (Path(folder) if folder is not None else None), group
        self.fixed = fixed or {}
        self._load, self._models, self._replace = load, models, replace
        self._failed: dict[str, str] = {}
        self._seen: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wanted(self) -> dict[str, dict[str, Any]]:
        return wanted(self.folder) if self.folder is not None else self.fixed

    def sync(self) -> None:
        """Load what is wanted and not held, drop what is held and no longer wanted. A
        fixed model that cannot load raises (the worker cannot serve its deployment); a
        catalog's fails alone, its reason written for the front."""
        want = self.wanted()
        held = self._models()
        keep = {n: r for n, r in held.items() if n in want}
        if len(keep) != len(held):
            dropped = sorted(set(held) - set(keep))
            self._replace(keep)
            log.info("neuronserve: unloaded %s", ", ".join(dropped))
            self._write()
        self._failed = {n: why for n, why in self._failed.items() if n in want}
        for name, entry in want.items():
            if name in keep or name in self._failed:
                continue
            try:
                runner = self._load(name, entry["artifact"], entry.get("truncation"))
            except Exception as e:
                if self.folder is None:
                    raise
                self._failed[name] = " | ".join(str(e).splitlines()) or type(e).__name__
                log.error("neuronserve: %s failed to load: %s", name, self._failed[name])
            else:
                self._replace({**self._models(), name: runner})
                log.info("neuronserve: loaded %s", name)
            self._write()
        self._write()

    def _write(self) -> None:
        if self.folder is None:
            return
        states = {n: READY for n in self._models()}
        states.update({n: FAILED + why for n, why in self._failed.items()})
        write_json(
            worker_file(self.folder, self.group),
            {"pid": os.getpid(), "group": self.group, "models": states},
        )

    def start(self) -> None:
        """Hold what is wanted now (before the worker says it is ready), then, with a
        catalog, follow it. The catalog's word is which artifacts to load: a folder
        another local user could write (or one above it) is refused (NotPrivate) before
        anything is read."""
        if self.folder is None:
            self.sync()
            return
        private_folder(self.folder)
        self._seen = self._stamp()
        self.sync()
        self._thread = threading.Thread(target=self._run, name="neuronserve-catalog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            seen = self._stamp()
            if seen != self._seen:
                self._seen = seen
                try:
                    self.sync()
                except Exception:
                    log.exception("neuronserve: following the catalog failed")

    def _stamp(self) -> tuple[int, int] | None:
        # written by rename: every new version is a new inode
        assert self.folder is not None
        try:
            st = (self.folder / WANTED).stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ino)

    def stop(self) -> None:
        self._stop.set()
