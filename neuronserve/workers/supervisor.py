"""The workers' supervisor: starts one worker process per core group of the plan,
says how each is (`workers.json` in the run folder: starting, ready, dead, and why), and
replaces one that dies or hangs, alone, while the others serve.

    python -m neuronserve.workers.supervisor RUN_DIR

A worker is ready once its socket answers a ping (it opens the socket only after it has
leased its cores and loaded every model). A ready worker is asked every PING_S how it is:
one that does not answer within its deadline, or whose oldest batch has run longer than
the spec's `response_timeout_s`, is killed (the front sends its requests once more to
another worker) and replaced. SIGTERM stops every worker and waits for them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..processes import private_file
from ..worker import FAILURE_MARKER
from .store import read_deployment
from .wire import FrameError, ask

# what the supervisor serves: the store's deployment folder and how many workers
SUPERVISOR_FILE = "supervisor.json"
STATUS_FILE = "workers.json"
SOCKETS = "sockets"
# how often workers are looked at, and ready ones asked how they are
LOOK_S = 0.1
PING_S = 1.0
# a ping is answered by the worker's event loop, not its batch thread: seconds it may take
PING_TIMEOUT_S = 5.0
# a replacement is started at once, then after this much longer each time in a row
BACKOFF_S = (0.0, 1.0, 2.0, 5.0)


def socket_path(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / SOCKETS / f"worker{index}.sock"


def log_path(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / f"worker{index}.log"


@dataclass
class Slot:
    """One worker of the plan (core group `index`) and the process serving it now."""

    index: int
    process: subprocess.Popen[bytes] | None = None
    state: str = "starting"
    since: float = field(default_factory=time.time)
    restarts: int = 0
    why: str = ""
    pinged: float = 0.0
    start_after: float = 0.0

    def status(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "pid": self.process.pid if self.process else None,
            "state": self.state,
            "since": self.since,
            "restarts": self.restarts,
            "why": self.why,
        }


class Supervisor:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        config = json.loads((self.run_dir / SUPERVISOR_FILE).read_text())
        self.model_dir = Path(config["model_dir"])
        self.hang_s = read_deployment(self.model_dir)[2].hang_s
        self.slots = [Slot(i) for i in range(int(config["workers"]))]
        self.stopping = False

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "stopping", True))
        for slot in self.slots:
            self.start(slot)
        self.write()
        while not self.stopping:
            changed = False
            for slot in self.slots:
                changed |= self.look(slot)
            if changed:
                self.write()
            time.sleep(LOOK_S)
        self.stop_all()

    def start(self, slot: Slot) -> None:
        sock = socket_path(self.run_dir, slot.index)
        sock.unlink(missing_ok=True)
        log = log_path(self.run_dir, slot.index)
        if log.exists():  # a replacement: the last one's log says why it went
            os.replace(log, log.with_name(log.name + ".previous"))
        with private_file(log) as out:
            slot.process = subprocess.Popen(
                [sys.executable, "-m", "neuronserve.workers.worker",
                 str(self.model_dir), str(sock), str(slot.index)],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        slot.state, slot.since = "starting", time.time()

    def look(self, slot: Slot) -> bool:
        """Whether the slot's state changed: a worker that ended, became ready, or hung."""
        now = time.monotonic()
        process = slot.process
        if process is None:
            if now >= slot.start_after:
                slot.restarts += 1
                self.start(slot)
                return True
            return False
        code = process.poll()
        if code is not None:
            self.ended(slot, code)
            return True
        sock = socket_path(self.run_dir, slot.index)
        if slot.state == "starting":
            if sock.exists() and self.answers(sock) is not None:
                slot.state, slot.since, slot.why, slot.pinged = "ready", time.time(), "", now
                return True
            return False
        if now - slot.pinged < PING_S:
            return False
        slot.pinged = now
        state = self.answers(sock)
        busy = state.get("busy_s") if state is not None else None
        if state is None or (busy is not None and busy > self.hang_s):
            what = "did not answer" if state is None else f"ran one batch for {busy:.0f}s"
            self.kill(slot, f"hung: it {what} (response_timeout_s {self.hang_s:g})")
            return True
        return False

    def answers(self, sock: Path) -> dict[str, Any] | None:
        try:
            return ask(str(sock), {"id": 0, "op": "ping"}, PING_TIMEOUT_S)
        except (OSError, FrameError, ValueError):
            return None

    def kill(self, slot: Slot, why: str) -> None:
        if slot.process is not None:
            with contextlib.suppress(ProcessLookupError):
                slot.process.kill()
            slot.process.wait()
        self.ended(slot, None, why)

    def ended(self, slot: Slot, code: int | None, why: str = "") -> None:
        """A worker's process ended: say why, and replace it (after a pause if it keeps
        ending)."""
        if not why:
            how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit {code}"
            failed = _failure(log_path(self.run_dir, slot.index))
            why = f"{how}: {failed}" if failed else how
        was_ready = slot.state == "ready"
        slot.process, slot.state, slot.since, slot.why = None, "dead", time.time(), why
        pause = BACKOFF_S[min(slot.restarts if not was_ready else 0, len(BACKOFF_S) - 1)]
        slot.start_after = time.monotonic() + pause
        if was_ready:
            slot.restarts = 0

    def stop_all(self) -> None:
        alive = [s.process for s in self.slots if s.process is not None]
        for p in alive:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        deadline = time.monotonic() + 10
        for p in alive:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for slot in self.slots:
            socket_path(self.run_dir, slot.index).unlink(missing_ok=True)
            slot.process, slot.state = None, "stopped"
        self.write()

    def write(self) -> None:
        """The workers' states, replaced whole (a reader never sees half of it)."""
        path = self.run_dir / STATUS_FILE
        staged = path.with_name(path.name + ".new")
        with private_file(staged) as f:
            json.dump({"workers": [s.status() for s in self.slots]}, f)
        os.replace(staged, path)


def _failure(log: Path) -> str:
    """What a worker that could not start said of it (its one FAILURE_MARKER line)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    found = [ln.split(FAILURE_MARKER, 1)[1].strip() for ln in lines if FAILURE_MARKER in ln]
    return found[-1] if found else ""


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: python -m {__name__} RUN_DIR", file=sys.stderr)
        return 2
    Supervisor(Path(argv[0])).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
