"""A module compiled elsewhere (an optimum-neuron export, artifact.ExportSettings) on
the pad-run-unpad path, which expects one float tensor per call: the export's first
answer, pooled here over the attention mask when it is every token's state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .artifact import ExportSettings
from .tasks.heads import pool


def served(module: Any, exported: ExportSettings | None, names: Sequence[str]) -> Any:
    """`module` as the execution path calls it: itself for neuronserve's own modules."""
    if exported is None:
        return module
    mask_at = list(names).index("attention_mask")
    pooling = exported.pooling

    def call(*tensors: torch.Tensor) -> torch.Tensor:
        out = module(*tensors)
        first = out[0] if isinstance(out, (tuple, list)) else out
        if pooling is None:
            return first.float()
        return pool(first, tensors[mask_at], pooling == "cls").float()

    return call
