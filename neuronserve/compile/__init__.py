"""Ahead-of-time compilation: one module per target, one driver for all of them."""

from __future__ import annotations

from .base import CompileError, Target


def get_target(name: str) -> Target:
    if name == "cpu":
        from .cpu import CpuTarget

        return CpuTarget()
    raise ValueError(f"unknown target {name!r}; this version supports: cpu")


def compile_model(*args, **kwargs):
    from .driver import compile_model as _compile

    return _compile(*args, **kwargs)


__all__ = ["CompileError", "Target", "compile_model", "get_target"]
