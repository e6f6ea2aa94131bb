"""sparse-embedding: SPLADE. A masked-LM model whose logits are pooled inside the compiled
module into one vocabulary-sized vector of term weights per text (heads.SpladeEncoder);
the answer lists the terms that weigh anything, as text-embeddings-inference's
/embed_sparse does: `[{"index": token id, "value": weight}, ...]` per text.

`--pooling splade` compiles a model this way, and so does a sentence-transformers
SparseEncoder folder (its SpladePooling module) with the default pooling.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import JsonResultsTask, RowOutputs, TaskRequest, WrappedModel
from .feature_extraction import cosines, prompt_fields
from .sentence_transformers import Splade, read_modules

if TYPE_CHECKING:
    import torch

    from ..tokenization import Encoded


class SparseEmbedding(JsonResultsTask):
    auto_class = "AutoModelForMaskedLM"
    name = "sparse-embedding"
    accepts_pairs = False
    parameters = frozenset({"prompt_name"})
    takes_prompts = True
    # Triton: each text's terms as JSON, one element per text (their count varies)

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        from .heads import SpladeEncoder

        splade = read_modules(model_dir).splade or Splade()
        module = SpladeEncoder(model, options["input_names"], splade.strategy, splade.activation)
        return WrappedModel(
            module=module.eval(),
            output_name="sparse_embedding",
            manifest_fields={
                "pooling": "splade",
                "normalize": False,
                "labels": None,
                "task_settings": {
                    "splade": {"strategy": splade.strategy, "activation": splade.activation}
                },
                **prompt_fields(model_dir),
            },
        )

    accuracy_metric = "min_cosine"
    accuracy_floor_field = "min_cosine"

    def accuracy(self, got: Any, want: Any) -> dict[str, float]:
        return {**super().accuracy(got, want), **cosines(got, want)}

    def finish(
        self,
        outputs: RowOutputs,
        encoded: Sequence[Sequence[Encoded]],
        request: TaskRequest,
        info: dict[str, Any],
    ) -> Any:
        return [sparse(row) for row in np.asarray(outputs)]


def sparse(vector: np.ndarray) -> list[dict[str, Any]]:
    """The weights of a SPLADE vector that are not zero, by term id."""
    (index,) = np.nonzero(vector)
    return [{"index": int(i), "value": float(vector[i])} for i in index]
