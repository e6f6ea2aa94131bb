"""Keeps a tritonserver's models whole: an instance whose Python-backend stub died is
replaced alone, while the model's other instances serve on.

Triton's Python backend never replaces a stub that died (SIGKILL, a crash, the OOM
killer): the server keeps the model READY and keeps handing the dead instance batches,
which fail ("Stub process ... is not healthy": the backend waits on the dead stub's
health before failing each). The healer
runs beside every tritonserver `serve triton` starts (its own process, so it serves
`serve triton`, the front and SageMaker alike), watches every stub (a pidfd each, so a
death wakes it at once; new stubs are found every `POLL_S`), and when one is gone uses
Triton's in-place instance update (a load whose config differs only in instance_group
adds and removes instances and leaves the others serving):

1. load the model's config without the dead instance's group: Triton drops that
   instance; the others never stop;
2. load it with the group back (its host policy renamed, so Triton sees a new group):
   the new instance leases the core group the dead process held, which the OS freed
   when it died, so on Neuron too it never needs a core a living process holds.

`packaging.triton` writes one instance group per core group for this
(`stubs.core_group_config`). A repository of another shape (a group of several
instances) is healed the old way: the model is unloaded and loaded again, an outage.
Model control is explicit (`--model-control-mode=explicit`), behind the admin key
(triton.py).

`instances.json` in the run directory says, per model, how many instances are alive of
how many expected and what the healer is doing (serving, replacing, failed); readiness
(`wait_ready`, the front's /ping and /health) reads the same counts (`instance_counts`).

A server that dies before the healer watches it (killed while the healer starts) still
leaves stubs holding their cores: the healer, given the server's pid, kills them and ends.
A stub killed while it sent a response cannot be taken out at all (REMOVE_S): the
healer says so and leaves that model alone.

    python -m neuronserve.engines.triton.healer RUN_DIR SERVER_PID
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import select
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

from ...pids import alive
from ...waiting import until
from . import process as triton
from .process import HEALER_STATUS_FILE as STATUS_FILE
from .stubs import (
    instance_of,
    kill_orphans,
    live_stubs,
    note_leftovers,
    stub_regions,
)

log = logging.getLogger("neuronserve.healer")

# how often new stubs are looked for (a death wakes the healer at once)
POLL_S = 0.5
# how long unloaded stubs may take to finish their requests and exit before they are
# killed, when a whole model is reloaded (their leases must be free before the load).
# Under load they do not exit by themselves: Triton's unload waits for the batches it had
# handed the dead stub, for as long as anyone watched; killed, Triton finishes the unload
# (the development guide's observations).
DRAIN_S = 3.0
# a replacement that failed is tried again after this long (the core may still be held
# by a process that is slow to die)
RETRY_S = 5.0
# how long taking a dead instance out may take (about a second: Triton checks the dead
# stub's health once). Longer, and Triton waits for the dead stub forever: tritonserver
# 2.51's Python backend hands each response a stub sends to a thread that waits, with no
# timeout, for the stub to take its turn back (python_be.cc ResponseSendDecoupled), and
# removing the instance joins that thread; a stub killed during a send never does.
REMOVE_S = 30.0


class Wedged(RuntimeError):
    """Triton's update of a model's instances never returned: no later update can."""


@dataclass
class ModelState:
    alive: int
    expected: int
    # serving | replacing | failed (tried again) | wedged (only a restart mends it)
    state: str = "serving"
    replacements: int = 0
    last_error: str = ""
    # each instance's stub process, as far as Triton may still hand it batches: a dead
    # one's pid until the healer has taken it out of rotation, then None until its
    # replacement's (the front waits for that before it sends a request again)
    instances: dict[str, int | None] = field(default_factory=dict)


def partitioned(groups: list[dict[str, Any]]) -> bool:
    """Whether each instance can be replaced alone: every group one instance, with a host
    policy of its own (what `packaging.triton` writes)."""
    policies = [g.get("host_policy", "") for g in groups]
    return (
        all(int(g.get("count", 1)) == 1 for g in groups)
        and len(set(policies)) == len(policies)
        and all(policies)
    )


def instance_names(groups: list[dict[str, Any]]) -> list[str]:
    """The instances Triton makes of `groups` (`<group>_<index>`)."""
    return [f"{g['name']}_{i}" for g in groups for i in range(max(int(g.get("count", 1)), 1))]


class ServerGone(Exception):
    """The tritonserver the healer was started for is gone."""


class Healer:
    def __init__(self, run_dir: Path, server_pid: int):
        self.run_dir = Path(run_dir)
        inst = triton.running(self.run_dir)
        if inst is None or inst.pid != server_pid:
            raise ServerGone(f"tritonserver {server_pid} no longer runs from {run_dir}")
        self.server_pid = server_pid
        self.url = inst.http_url
        key = (self.run_dir / triton.ADMIN_KEY_FILE).read_text().strip()
        self.headers = {triton.ADMIN_HEADER: key, "Connection": "close"}
        # each model's instance groups as the server loaded them: what "whole" means
        self.groups = {m: self._config(m)["instance_group"] for m in inst.expected}
        self.states = {
            m: ModelState(len(live_stubs(self.server_pid).get(m, [])), n)
            for m, n in inst.expected.items()
        }
        self.generation: dict[tuple[str, str], int] = {}
        self.wedged: set[str] = set()  # models Triton can no longer update
        self.noted: set[str] = set()
        self.exits: dict[int, int] = {}  # stub pid -> pidfd

    def write_status(self) -> None:
        path = self.run_dir / STATUS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({m: asdict(s) for m, s in self.states.items()}))
        os.replace(tmp, path)

    def run(self) -> None:
        self.write_status()
        log.info("watching %s (tritonserver pid %d)", ", ".join(self.states), self.server_pid)
        while alive(self.server_pid):
            stubs = live_stubs(self.server_pid)
            regions = stub_regions(stubs)
            if not regions <= self.noted:
                note_leftovers(self.run_dir, regions)
                self.noted |= regions
            for model, state in self.states.items():
                mine = stubs.get(model, [])
                state.alive = len(mine)
                running = {instance_of(p): p.pid for p in mine}
                # a dead instance keeps its (dead) pid until it is out of rotation
                state.instances = {**state.instances, **running}
                dead = [n for n in instance_names(self.groups[model]) if n not in running]
                # a server that died since leaves no child: nothing to replace
                if dead and model not in self.wedged and alive(self.server_pid):
                    self.heal(model, dead)
            self.write_status()
            self._wait(stubs)
        stop_orphans(self.server_pid)

    def _wait(self, stubs: dict[str, list[psutil.Process]]) -> None:
        """Sleep POLL_S, or less: until one of `stubs` exits (each watched by a pidfd,
        readable once its process is gone)."""
        pids = {p.pid for ps in stubs.values() for p in ps}
        for pid in set(self.exits) - pids:
            os.close(self.exits.pop(pid))
        poller = select.poll()
        for pid in pids:
            if pid not in self.exits:
                try:
                    self.exits[pid] = os.pidfd_open(pid)
                except OSError:  # gone already: look again now
                    return
            poller.register(self.exits[pid], select.POLLIN)
        poller.poll(POLL_S * 1000)

    def heal(self, model: str, dead: list[str]) -> None:
        state = self.states[model]
        log.warning(
            "neuronserve: %s of %s died (%d of %d instances alive): replacing %s",
            ", ".join(dead),
            model,
            state.alive,
            state.expected,
            "it alone" if partitioned(self.groups[model]) else "the whole model",
        )
        state.state = "replacing"
        self.write_status()
        started = time.monotonic()
        try:
            if partitioned(self.groups[model]):
                self._replace(model, dead)
            else:
                self._reload(model)
        except (requests.RequestException, RuntimeError) as e:
            state.state = "wedged" if isinstance(e, Wedged) else "failed"
            state.last_error = str(e)
            self.write_status()
            if isinstance(e, Wedged):  # never again: it would wait behind the first
                self.wedged.add(model)
                log.error("neuronserve: replacing %s failed: %s", model, e)
                return
            if not alive(self.server_pid):  # its orphans are killed at once (run)
                log.error("neuronserve: replacing %s failed: %s (tritonserver is gone)", model, e)
                return
            log.error("neuronserve: replacing %s failed: %s (again in %gs)", model, e, RETRY_S)
            time.sleep(RETRY_S)
            return
        state.state, state.last_error = "serving", ""
        state.replacements += 1
        state.alive = len(live_stubs(self.server_pid).get(model, []))
        log.info("%s of %s replaced in %.1fs", ", ".join(dead), model, time.monotonic() - started)

    def _replace(self, model: str, dead: list[str]) -> None:
        """Drop the dead instances' groups from the model (the others serve on), then put
        them back under a new host policy: new instances, on the freed core groups."""
        config = self._config(model)
        gone = {n.rpartition("_")[0] for n in dead}
        present = [g for g in config["instance_group"] if g["name"] not in gone]
        if present:
            if len(present) < len(config["instance_group"]):
                try:
                    self._load(model, {**config, "instance_group": present}, REMOVE_S)
                except requests.Timeout:
                    raise Wedged(
                        f"Triton did not take {', '.join(dead)} out in {REMOVE_S:g}s: its Python "
                        "backend waits forever for a stub killed while it sent a response, and "
                        f"{model} can no longer be updated; the other instances serve on. "
                        "Restarting the server makes the model whole again (the front "
                        "does so itself)."
                    ) from None
            # out of rotation now: a request sent again reaches a live instance (with
            # every instance dead, none is taken out: they stay until replaced)
            self.states[model].instances.update(dict.fromkeys(dead))
            self.write_status()
        groups = copy.deepcopy(self.groups[model])
        for g in groups:
            if g["name"] in gone:
                key = (model, g["name"])
                self.generation[key] = self.generation.get(key, 0) + 1
            n = self.generation.get((model, g["name"]), 0)
            if n:
                g["host_policy"] = f"{g['host_policy']}.{n}"
        self._load(model, {**config, "instance_group": groups})

    def _reload(self, model: str) -> None:
        """Unload and load the whole model (a repository whose groups are not one per
        core group): its requests fail meanwhile."""
        self._call("unload", model)
        self._drain(model)
        self._call("load", model)

    def _config(self, model: str) -> dict[str, Any]:
        r = requests.get(f"{self.url}/v2/models/{model}/config", headers=self.headers, timeout=30)
        if r.status_code != 200:
            raise RuntimeError(f"config of {model}: {r.status_code} {r.text[:2000]}")
        return dict(r.json())

    def _load(self, model: str, config: dict[str, Any], timeout: float = 900) -> None:
        self._call("load", model, {"parameters": {"config": json.dumps(config)}}, timeout)

    def _call(
        self, action: str, model: str, body: dict[str, Any] | None = None, timeout: float = 900
    ) -> None:
        r = requests.post(
            f"{self.url}/v2/repository/models/{model}/{action}",
            headers=self.headers,
            json=body,
            timeout=timeout,
        )
        if r.status_code != 200:
            raise RuntimeError(f"{action}: {r.status_code} {r.text[:2000]}")

    def _drain(self, model: str) -> None:
        """Wait until the unloaded model's stubs are gone (their leases released);
        kill what is left after DRAIN_S."""
        until(lambda: not live_stubs(self.server_pid).get(model), DRAIN_S)
        left = live_stubs(self.server_pid).get(model, [])
        for p in left:
            log.warning("stub %d of %s did not exit after unload: killed", p.pid, model)
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(left, timeout=10)


def stop_orphans(server_pid: int) -> None:
    """A server that crashed leaves its stubs running, holding their cores: kill them."""
    killed = kill_orphans(server_pid)
    log.info("tritonserver is gone: the healer stops (%d stub(s) it left killed)", killed)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        print(
            "usage: python -m neuronserve.engines.triton.healer RUN_DIR SERVER_PID",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s neuronserve healer %(message)s", stream=sys.stdout
    )
    server_pid = int(args[1])
    try:
        healer = Healer(Path(args[0]), server_pid)
    except (ServerGone, requests.RequestException, OSError):
        if alive(server_pid):
            raise
        stop_orphans(server_pid)  # killed before the healer could watch it
        return 0
    healer.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
