"""The one interface every target implements: compile a module for a bucket, save it,
load it (onto a given core where the target has them), say what precision the compiler
really runs, and whether compiled modules can run on this host at all."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import torch

from .errors import CompileError

__all__ = ["CompileError", "Target"]


class Target(Protocol):
    name: str
    # True: one module serves every bucket (the grid only bounds padding).
    # False: one module per bucket, each compiled for exactly that shape.
    dynamic_shapes: bool
    file_suffix: str
    # what `precision: auto` tries, in order (a target may also define `variants(precision)`:
    # the candidate builds a named precision may get, default just that precision; and
    # `unavailable(candidate)`: why that build cannot be made on this host, which then
    # counts as refused while the other candidates are still tried)
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
