"""The target registry: a target's name -> the class that compiles, saves and loads
for it, and the kind of core its workers lease. Modules are imported on first use, so
naming a Neuron target on a machine without the SDK costs nothing until something is
compiled or loaded for it, and asking a target's core kind imports no torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Target

# name -> (module under neuronserve.compile, class, the kind of core a worker leases)
TARGETS: dict[str, tuple[str, str, str]] = {
    "cpu": ("cpu", "CpuTarget", "cpu"),
    "neuronx": ("neuronx", "NeuronxTarget", "neuron"),  # Inf2, Trn1
    "neuron": ("neuron", "NeuronTarget", "neuron"),  # Inf1
}


def _entry(name: str) -> tuple[str, str, str]:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(
            f"unknown target {name!r}; choose cpu, neuronx (Inf2/Trn1) or neuron (Inf1)"
        ) from None


def get_target(name: str) -> Target:
    module, cls, _ = _entry(name)
    target: Target = getattr(importlib.import_module(f"{__package__}.{module}"), cls)()
    return target


def core_kind(name: str) -> str:
    """The kind of core a worker of target `name` leases: "cpu" or "neuron"."""
    return _entry(name)[2]


# device calls an engine batch holds on a target whose calls leave the host's CPU free
# (a NeuronCore): the worker tokenizes and answers one group while the device runs
# another, so the engine's batch is several of the device's (Runner.outputs). On CPU
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

    from ..cores import instance_family

    if not (any(Path("/dev").glob("neuron[0-9]*")) or os.environ.get("NEURON_RT_VISIBLE_CORES")):
        return "cpu"
    return "neuron" if (instance_family() or "").startswith("inf1") else "neuronx"
