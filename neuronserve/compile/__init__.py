"""Ahead-of-time compilation: one module per target, one driver for all of them.

Names are imported on first use: the target registry (which core kind each target's
workers lease) is read by processes that never compile, and must not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..targets import get_target
    from .base import CompileError, Target

__all__ = ["CompileError", "Target", "get_target"]

_WHERE = {
    "CompileError": ".errors",
    "Target": ".base",
    "get_target": ".targets",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
