"""feature-extraction: one embedding per text, pooled inside the compiled module.

Pooling runs in the module so padded positions are excluded by the attention mask
on every target, and the server moves one vector per text instead of a matrix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import Task, TaskRequest, TensorSpec, WrappedModel

if TYPE_CHECKING:
    import torch


def sentence_transformers_pooling(model_dir: Path) -> tuple[str | None, bool | None]:
    """(pooling, normalize) from a sentence-transformers layout, or (None, None)."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return None, None
    modules = json.loads(modules_file.read_text())
    pooling, normalize = None, False
    for m in modules:
        kind = m.get("type", "")
        if kind.endswith("models.Pooling"):
            cfg = json.loads((model_dir / m.get("path", "") / "config.json").read_text())
            if cfg.get("pooling_mode_cls_token"):
                pooling = "cls"
            elif cfg.get("pooling_mode_mean_tokens"):
                pooling = "mean"
            else:
                modes = [k for k, v in cfg.items() if k.startswith("pooling_mode") and v]
                raise ValueError(
                    f"{model_dir}: sentence-transformers pooling {modes} is not supported; "
                    "set `pooling: mean` or `pooling: cls` in the spec to override"
                )
        elif kind.endswith("models.Normalize"):
            normalize = True
    return pooling, normalize


def cosines(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    """Lowest and mean cosine of each compiled embedding to its eager one."""
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    cos = np.sum(got * want, axis=1) / np.maximum(norms, 1e-12)
    return {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}


class FeatureExtraction(Task):
    auto_class = "AutoModel"
    name = "feature-extraction"
    accepts_pairs = False
    parameters = frozenset()

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        st_pooling, st_normalize = sentence_transformers_pooling(model_dir)
        pooling = options.get("pooling", "auto")
        if pooling == "auto":
            pooling = st_pooling or "cls"
        normalize = options.get("normalize")
        if normalize is None:
            normalize = bool(st_normalize)
        from .heads import PooledEncoder

        module = PooledEncoder(model, pooling, normalize, options["input_names"]).eval()
        return WrappedModel(
            module=module,
            output_name="embedding",
            manifest_fields={"pooling": pooling, "normalize": normalize, "labels": None},
        )

    accuracy_metric = "min_cosine"
    accuracy_floor_field = "min_cosine"

    def accuracy(self, got: Any, want: Any) -> dict[str, float]:
        return {**super().accuracy(got, want), **cosines(got, want)}

    def respond(self, outputs: np.ndarray, request: TaskRequest, info: dict[str, Any]) -> Any:
        vectors = outputs.astype(np.float32).tolist()
        return vectors[0] if request.single else vectors

    def output_tensors(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        return [TensorSpec("EMBEDDING", "float32", (output_dim,))]

    def tensors(self, outputs: np.ndarray, info: dict[str, Any]) -> dict[str, np.ndarray]:
        return {"EMBEDDING": outputs.astype(np.float32)}
