"""Ahead-of-time compilation: one module per target, one driver for all of them."""

from __future__ import annotations

from .base import CompileError, Target


def get_target(name: str) -> Target:
    if name == "cpu":
        from .cpu import CpuTarget

        return CpuTarget()
    if name == "neuronx":
        from .neuronx import NeuronxTarget

        return NeuronxTarget()
    if name == "neuron":
        from .neuron import NeuronTarget

        return NeuronTarget()
    raise ValueError(f"unknown target {name!r}; choose cpu, neuronx (Inf2/Trn1) or neuron (Inf1)")


def compile_model(*args, **kwargs):
    from .driver import compile_model as _compile

    return _compile(*args, **kwargs)


__all__ = ["CompileError", "Target", "compile_model", "get_target"]
