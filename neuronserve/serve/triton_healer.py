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

import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import requests

from . import triton
from .process import alive
from .triton import HEALER_STATUS_FILE as STATUS_FILE
from .triton_stubs import (
    Count,
    counts_from_stubs,
    instance_counts,
    live_stubs,
    note_leftovers,
    stub_regions,
)

log = logging.getLogger("neuronserve.healer")

POLL_S = 0.5
# how long unloaded stubs may take to finish their requests and exit before they are
# killed (their leases must be free before the reload). Under load they do not exit by
# themselves: Triton's unload waits for the batches it had handed the dead stub (measured:
# still waiting after 60 s); killed, Triton finishes the unload about 10 s later.
DRAIN_S = 3.0
# a reload that failed is tried again after this long (the core may still be held by a
# process that is slow to die)
RETRY_S = 5.0


@dataclass
class ModelState:
    alive: int
    expected: int
    state: str = "serving"  # serving | reloading | failed
    reloads: int = 0
    last_error: str = ""


class Healer:
    def __init__(self, run_dir: Path):
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
            for model, count in counts_from_stubs(stubs, self.expected).items():
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
