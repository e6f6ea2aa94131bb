"""Keeps a tritonserver's models whole: a model whose Python-backend stub died is
reloaded through Triton's model-control API.

Triton's Python backend never replaces a stub that died (SIGKILL, a crash, the OOM
killer): the server keeps reporting the model READY and keeps sending every other
batch to the dead instance, which answers "Stub process ... is not healthy" (measured
here: 10 of 20 sequential requests failed after one kill, for as long as the server
ran). The healer runs beside every tritonserver `serve triton` starts (its own process,
so it serves `serve triton`, the front and SageMaker alike), counts each model's live
stubs against its config's instance count every `POLL_S`, and when one is missing:
unloads the model (Triton lets requests in flight finish), waits until its stubs are
gone so their core leases are free, and loads it again; the new instances lease the
freed core groups. Model control is explicit (`--model-control-mode=explicit`) for
this, and behind the admin key (triton.py).

`instances.json` in the run directory says, per model, how many instances are alive of
how many expected and what the healer is doing (serving, reloading, failed); readiness
(`wait_ready`, the front's /ping and /health) reads the same counts (`instance_counts`).

    python -m neuronserve.serve.triton_healer RUN_DIR
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import requests

from .process import alive

log = logging.getLogger("neuronserve.healer")

POLL_S = 0.5
STATUS_FILE = "instances.json"
PID_FILE = "healer.pid"
LOG_FILE = "healer.log"
STUB = "triton_python_backend_stub"
# how long unloaded stubs may take to finish their requests and exit before they are
# killed (their leases must be free before the reload). Under load they do not exit by
# themselves: Triton's unload waits for the batches it had handed the dead stub (measured:
# still waiting after 60 s); killed, Triton finishes the unload about 10 s later.
DRAIN_S = 3.0
# a reload that failed is tried again after this long (the core may still be held by a
# process that is slow to die)
RETRY_S = 5.0


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
    return counts_of(live_stubs(server_pid), expected)


def counts_of(stubs: dict[str, list[psutil.Process]], expected: dict[str, int]) -> dict[str, Count]:
    return {m: Count(len(stubs.get(m, [])), n) for m, n in expected.items()}


@dataclass
class ModelState:
    alive: int
    expected: int
    state: str = "serving"  # serving | reloading | failed
    reloads: int = 0
    last_error: str = ""


class Healer:
    def __init__(self, run_dir: Path):
        from . import triton

        self.run_dir = Path(run_dir)
        inst = triton.running(self.run_dir)
        if inst is None:
            raise SystemExit(f"no tritonserver runs from {run_dir}")
        self.server_pid = inst.pid() or 0
        self.url = inst.http_url
        self.expected = inst.expected
        key = (self.run_dir / triton.ADMIN_KEY_FILE).read_text().strip()
        self.headers = {triton.ADMIN_HEADER: key, "Connection": "close"}
        counts = instance_counts(self.server_pid, self.expected)
        self.states = {m: ModelState(c.alive, c.expected) for m, c in counts.items()}
        self.noted: set[str] = set()

    def write_status(self) -> None:
        path = self.run_dir / STATUS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({m: asdict(s) for m, s in self.states.items()}))
        os.replace(tmp, path)

    def run(self) -> None:
        self.write_status()
        log.info("watching %s (tritonserver pid %d)", ", ".join(self.expected), self.server_pid)
        while alive(self.server_pid):
            stubs = live_stubs(self.server_pid)
            regions = stub_regions(stubs)
            if not regions <= self.noted:
                note_leftovers(self.run_dir, regions)
                self.noted |= regions
            for model, count in counts_of(stubs, self.expected).items():
                state = self.states[model]
                state.alive = count.alive
                if not count.whole:
                    self.heal(model, count)
            self.write_status()
            time.sleep(POLL_S)
        log.info("tritonserver is gone: the healer stops")

    def heal(self, model: str, count: Count) -> None:
        state = self.states[model]
        log.warning(
            "neuronserve: %s has %d of %d instances alive (a stub died): reloading it",
            model,
            count.alive,
            count.expected,
        )
        state.state = "reloading"
        self.write_status()
        started = time.monotonic()
        try:
            self._call("unload", model)
            self._drain(model)
            self._call("load", model)
        except (requests.RequestException, RuntimeError) as e:
            state.state, state.last_error = "failed", str(e)
            log.error("neuronserve: reloading %s failed: %s (again in %gs)", model, e, RETRY_S)
            self.write_status()
            time.sleep(RETRY_S)
            return
        state.state, state.last_error = "serving", ""
        state.reloads += 1
        state.alive = len(live_stubs(self.server_pid).get(model, []))
        log.info("%s reloaded in %.1fs", model, time.monotonic() - started)

    def _call(self, action: str, model: str) -> None:
        r = requests.post(
            f"{self.url}/v2/repository/models/{model}/{action}", headers=self.headers, timeout=900
        )
        if r.status_code != 200:
            raise RuntimeError(f"{action}: {r.status_code} {r.text[:2000]}")

    def _drain(self, model: str) -> None:
        """Wait until the unloaded model's stubs are gone (their leases released);
        kill what is left after DRAIN_S."""
        deadline = time.monotonic() + DRAIN_S
        while (left := live_stubs(self.server_pid).get(model, [])) and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in left:
            log.warning("stub %d of %s did not exit after unload: killed", p.pid, model)
            p.kill()
        psutil.wait_procs(left, timeout=10)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m neuronserve.serve.triton_healer RUN_DIR", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s neuronserve healer %(message)s", stream=sys.stdout
    )
    Healer(Path(args[0])).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
