"""CPU target: TorchScript trace + freeze, one module with dynamic shapes.

The traced graph accepts any (batch, sequence); the bucket grid only bounds padding
so the module sees the shapes that were validated and warmed up. One file holds the
weights once, whatever the grid.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch


class CpuTarget:
    name = "cpu"
    dynamic_shapes = True
    core_kind = "cpu"
    file_suffix = ".pt"
    weights_file = None  # frozen into the one module

    def compile(self, module: torch.nn.Module, example: tuple[torch.Tensor, ...],
                options: dict[str, Any]) -> torch.nn.Module:
        with torch.no_grad(), warnings.catch_warnings():
            # transformers' masking code warns that Python branches are frozen into the
            # trace; every bucket is validated against eager afterwards, which is the check
            # that matters.
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(module.eval(), example, check_trace=False)
            return torch.jit.freeze(traced)

    def save(self, compiled: torch.nn.Module, path: Path) -> None:
        torch.jit.save(compiled, str(path))

    def load(self, path: Path) -> torch.nn.Module:
        return torch.jit.load(str(path), map_location="cpu").eval()

    def versions(self) -> dict[str, str]:
        return {"compiler": f"torch.jit {torch.__version__}"}

    def describe(self, options: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
        return {"cores_per_module": 1}
