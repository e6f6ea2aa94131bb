"""The target registry: a target's name -> the class that compiles, saves and loads
for it (under neuronserve.compile), and the kind of core its workers lease. It sits low:
placement reads the core kinds, compile the classes. Modules are imported on first use, so
naming a Neuron target on a machine without the SDK costs nothing until something is
compiled or loaded for it, and asking a target's core kind imports no torch."""

from __future__ import annotations

import importlib
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

COMPILE_PACKAGE = "neuronserve.compile"
# name -> (module under neuronserve.compile, class, the kind of core a worker leases)
TARGETS: dict[str, tuple[str, str, str]] = {
    "cpu": ("cpu", "CpuTarget", "cpu"),
    "neuronx": ("neuronx", "NeuronxTarget", "neuron"),  # Inf2, Trn1
    "neuron": ("neuron", "NeuronTarget", "neuron"),  # Inf1
}


class Target(Protocol):
    name: str
    # True: one module serves every bucket (the grid only bounds padding).
    # False: one module per bucket, each compiled for exactly that shape.
    dynamic_shapes: bool
    file_suffix: str
    # what `precision: auto` tries, in order (a target may also define `variants(precision)`:
    # the candidate builds a named precision may get, default just that precision; and
    # `unavailable(candidate, named)`: why that build cannot be made, or is not worth making,
    # on this host (`named`: the user named its precision), which then counts as refused
    # while the other candidates are still tried)
    auto_precisions: tuple[str, ...]
    # True: auto keeps the fastest candidate that meets the accuracy floor (timed here);
    # False: the first that meets it (the order is fastest first on that hardware)
    auto_times_candidates: bool

    def compile(
        self, module: torch.nn.Module, example: tuple[torch.Tensor, ...], options: dict[str, Any]
    ) -> torch.nn.Module: ...

    def save(self, compiled: torch.nn.Module, path: Path) -> None: ...

    def load(
        self, path: Path, core: int | None = None, data: bytes | None = None
    ) -> torch.nn.Module:
        """The saved module, ready to run; `core` is the index, among the cores this process
        sees, of the core to place it on (None: wherever the target puts it). `data`: the
        file's bytes, read and verified by the caller, loaded instead of reading `path`
        again (which then only names the file and its format)."""
        ...

    def versions(self) -> dict[str, str]: ...

    def describe(self, options: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
        """What the manifest records about this compile: the precision the compiler really
        runs (`precision`), compiler arguments, cores per module, weight bytes per module.
        Raises ValueError for options the target cannot honour."""
        ...

    def cannot_run_here(self, options: dict[str, Any]) -> str | None:
        """Why modules compiled with `options` cannot be loaded and run in this process
        (so compile saves them unvalidated), or None."""
        ...

    def compiling(self, options: dict[str, Any]) -> AbstractContextManager[None]:
        """What this process holds while it compiles and checks (a Neuron target leases and
        pins a core, as a worker does)."""
        ...

    def replicas(self, cores_per_worker: int, cores_per_module: int) -> int:
        """How many copies of each module a worker of that many cores keeps (one per core
        where one call runs on one core)."""
        ...


def _entry(name: str) -> tuple[str, str, str]:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(
            f"unknown target {name!r}; choose cpu, neuronx (Inf2/Trn1) or neuron (Inf1)"
        ) from None


def get_target(name: str) -> Target:
    module, cls, _ = _entry(name)
    target: Target = getattr(importlib.import_module(f"{COMPILE_PACKAGE}.{module}"), cls)()
    return target


def core_kind(name: str) -> str:
    """The kind of core a worker of target `name` leases: "cpu" or "neuron"."""
    return _entry(name)[2]


# device calls a worker's batch holds on a target whose calls leave the host's CPU free
# (a NeuronCore): the worker tokenizes and answers one group while the device runs
# another, so the worker's batch is several of the device's (Runner.start). On CPU
# the same cores do both, and one call per batch is best.
PIPELINE_DEPTH = {"cpu": 1, "neuron": 4}


def pipeline_depth(name: str) -> int:
    """Device calls one engine batch of target `name` should hold."""
    return PIPELINE_DEPTH[core_kind(name)]


def host_target() -> str:
    """The target this host serves best: neuron on Inf1, neuronx where it has other
    NeuronCores (Inf2, Trn1, Trn2: /dev/neuron* devices, or cores given to a container),
    else cpu."""
    import os
    from pathlib import Path

    from .cores import instance_family

    if not (any(Path("/dev").glob("neuron[0-9]*")) or os.environ.get("NEURON_RT_VISIBLE_CORES")):
        return "cpu"
    return "neuron" if (instance_family() or "").startswith("inf1") else "neuronx"
