"""text-classification: scores over the model's `id2label` (softmax, or sigmoid for one
label, as the `transformers` pipeline does), top_k per text.

The compiled module returns logits; softmax and ranking run on the host in numpy,
in float64, so scores do not depend on the target's precision beyond the logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import (
    RequestError,
    Task,
    TaskRequest,
    WrappedModel,
    logits_over_labels,
)

if TYPE_CHECKING:
    import torch


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))


FUNCTIONS = {"softmax": softmax, "sigmoid": sigmoid, "none": lambda x: x.astype(np.float64)}


def default_function(labels: list[str], multi: bool = False) -> str:
    """What the `transformers` classification pipelines apply: sigmoid for a model with
    one label (a cross-encoder's relevance score) or trained multi-label, else softmax."""
    return "sigmoid" if len(labels) == 1 or multi else "softmax"


def multi_label(config: Any) -> bool:
    return getattr(config, "problem_type", None) == "multi_label_classification"


class TextClassification(Task):
    auto_class = "AutoModelForSequenceClassification"
    name = "text-classification"
    accepts_pairs = True
    parameters = frozenset({"top_k", "function_to_apply"})

    def check_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        top_k = parameters.get("top_k", 1)
        valid = isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 1
        if top_k is not None and not valid:
            raise RequestError(
                f'"top_k" must be a positive integer or null (all labels), got {top_k!r}'
            )
        function = parameters.get("function_to_apply")
        if function is not None and function not in FUNCTIONS:
            raise RequestError(
                f'"function_to_apply" must be one of {sorted(FUNCTIONS)} or null (the '
                f"model's default), got {function!r}"
            )
        return {"top_k": top_k, "function_to_apply": function}

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        from .heads import LogitsClassifier

        config: Any = model.config
        module = LogitsClassifier(model, options["input_names"])
        return logits_over_labels(module, config, multi_label=multi_label(config))

    accuracy_metric = "argmax_agreement"
    accuracy_floor_field = "min_argmax_agreement"

    def accuracy(self, got: Any, want: Any) -> dict[str, float]:
        agree = np.argmax(got, axis=1) == np.argmax(want, axis=1)
        return {
            **super().accuracy(got, want),
            "argmax_agreement": float(agree.mean()),
            "max_abs_prob_diff": float(np.max(np.abs(softmax(got) - softmax(want)))),
        }

    def respond(self, outputs: np.ndarray, request: TaskRequest, info: dict[str, Any]) -> Any:
        labels = info["labels"]
        top_k = request.parameters.get("top_k") or len(labels)
        function = request.parameters.get("function_to_apply") or default_function(
            labels, bool(info.get("multi_label"))
        )
        scores = FUNCTIONS[function](outputs)
        results = []
        for row in scores:
            order = np.argsort(-row, kind="stable")[:top_k]
            results.append([{"label": labels[i], "score": float(row[i])} for i in order])
        return results[0] if request.single else results
