"""The one interface every target implements: compile a module, save and load it,
and say what a worker must pin before loading it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch


class CompileError(RuntimeError):
    """Compilation or validation against the eager model failed."""


class Target(Protocol):
    name: str
    # True: one module serves every bucket (the grid only bounds padding).
    # False: one module per bucket, each compiled for exactly that shape.
    dynamic_shapes: bool
    # Which cores a worker leases for this target ("cpu", "neuron", "cuda").
    core_kind: str
    file_suffix: str
    # set when compiled modules take their weights at load (one file for all buckets)
    weights_file: str | None

    def save_weights(self, module: torch.nn.Module, path: Path) -> None: ...

    def attach_weights(self, modules: list[torch.nn.Module], path: Path) -> None: ...

    def compile(
        self, module: torch.nn.Module, example: tuple[torch.Tensor, ...], options: dict[str, Any]
    ) -> torch.nn.Module: ...

    def save(self, compiled: torch.nn.Module, path: Path) -> None: ...

    def load(self, path: Path) -> torch.nn.Module: ...

    def versions(self) -> dict[str, str]: ...

    def describe(self, options: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
        """What the manifest records about this compile (compiler args, cores per module)."""
        ...
