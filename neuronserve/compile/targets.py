"""The target registry: a target's name -> the class that compiles, saves and loads
for it. Modules are imported on first use, so naming a Neuron target on a machine
without the SDK costs nothing until something is compiled or loaded for it."""

from __future__ import annotations

import importlib

from .base import Target

# name -> (module under neuronserve.compile, class)
TARGETS: dict[str, tuple[str, str]] = {
    "cpu": ("cpu", "CpuTarget"),
    "neuronx": ("neuronx", "NeuronxTarget"),  # Inf2, Trn1
    "neuron": ("neuron", "NeuronTarget"),  # Inf1
}


def get_target(name: str) -> Target:
    try:
        module, cls = TARGETS[name]
    except KeyError:
        raise ValueError(
            f"unknown target {name!r}; choose cpu, neuronx (Inf2/Trn1) or neuron (Inf1)"
        ) from None
    target: Target = getattr(importlib.import_module(f"{__package__}.{module}"), cls)()
    return target
