"""Ahead-of-time compilation: one module per target, one driver for all of them."""

from __future__ import annotations

from .base import CompileError, Target
from .driver import compile_model
from .targets import get_target

__all__ = ["CompileError", "Target", "compile_model", "get_target"]
