"""What compile offers its callers: the interface every target implements (Target, in
the target registry) and the error a compile raises."""

from __future__ import annotations

from ..targets import Target
from .errors import CompileError

__all__ = ["CompileError", "Target"]
