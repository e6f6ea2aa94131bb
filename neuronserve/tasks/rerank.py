"""rerank: a cross-encoder scores every (query, document) pair; the answer lists the
documents by score, as text-embeddings-inference's and Cohere's /rerank do.

Each pair is one row, so a request with more documents than the largest bucket is split
across bucket runs by the one execution path like any other batch. The score is the
sigmoid of a one-label model's logit (the transformers pipeline's choice for one label),
or the softmax probability of the spec's `relevance_label` for a model of several.
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
    boolean,
    labels_of,
    logits_over_labels,
    positive_int,
    truncation_parameters,
)
from .text_classification import sigmoid, softmax

if TYPE_CHECKING:
    import torch


class Rerank(Task):
    auto_class = "AutoModelForSequenceClassification"
    name = "rerank"
    accepts_pairs = True
    pairs_required = True
    body_fields = ("query", "documents")
    parameters = frozenset({"top_n", "return_documents", "raw_scores"})

    def parse(self, inputs: Any, parameters: dict[str, Any]) -> TaskRequest:
        if isinstance(inputs, list):  # (query, document) pairs as {"text", "text_pair"}
            request = super().parse(inputs, parameters)
            if not all(isinstance(t, tuple) for t in request.texts):
                raise RequestError('a rerank request\'s inputs are {"text", "text_pair"} pairs')
            return request
        if not isinstance(inputs, dict) or set(inputs) != {"query", "documents"}:
            raise RequestError(
                'a rerank request is {"query": "...", "documents": ["...", ...]} '
                '(optionally with "parameters")'
            )
        query, documents = inputs["query"], inputs["documents"]
        if not isinstance(query, str):
            raise RequestError(f'"query" must be a string, got {type(query).__name__}')
        if not isinstance(documents, list):
            raise RequestError(
                f'"documents" must be a list of strings, got {type(documents).__name__}'
            )
        if not documents:
            raise RequestError('"documents" is an empty list: send at least one document')
        for i, d in enumerate(documents):
            if not isinstance(d, str):
                raise RequestError(f"documents[{i}] must be a string, got {type(d).__name__}")
        truncate, direction = truncation_parameters(parameters)
        return TaskRequest(
            texts=[(query, d) for d in documents],
            single=False,
            parameters=self.own_parameters(parameters),
            truncate=truncate,
            truncation_direction=direction,
        )

    def check_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        return {
            "top_n": positive_int(parameters, "top_n", None),
            "return_documents": boolean(parameters, "return_documents", False),
            "raw_scores": boolean(parameters, "raw_scores", False),
        }

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        from .heads import LogitsClassifier

        config: Any = model.config
        labels = labels_of(config)
        chosen = options.get("relevance_label")
        if chosen is None and len(labels) > 1:
            raise ValueError(
                f"{model_dir} has {len(labels)} labels {labels}: name the one whose "
                "probability ranks documents with `relevance_label` (--relevance-label)"
            )
        if chosen is not None and chosen not in labels:
            raise ValueError(f"relevance_label {chosen!r} is not one of the model's {labels}")
        return logits_over_labels(
            LogitsClassifier(model, options["input_names"]),
            config,
            relevance_index=labels.index(chosen) if chosen else 0,
        )

    accuracy_metric = "spearman"
    accuracy_floor_field = "min_spearman"

    def accuracy(self, got: Any, want: Any) -> dict[str, float]:
        g, w = relevance(got, 0), relevance(want, 0)
        return {
            **super().accuracy(got, want),
            "spearman": spearman(g, w),
            "max_score_diff": float(np.max(np.abs(g - w))),
        }

    def respond(self, results: Any, request: TaskRequest, info: dict[str, Any]) -> Any:
        p = request.parameters
        index = int(info.get("relevance_index", 0))
        scores = (
            results[:, index].astype(np.float64)
            if p.get("raw_scores")
            else (relevance(results, index))
        )
        order = np.argsort(-scores, kind="stable")[: p.get("top_n") or len(scores)]
        ranked = []
        for i in order:
            entry: dict[str, Any] = {"index": int(i), "score": float(scores[i])}
            if p.get("return_documents"):
                entry["document"] = request.texts[i][1]
            ranked.append(entry)
        return ranked


def relevance(logits: np.ndarray, index: int) -> np.ndarray:
    """Each pair's score: sigmoid of a one-label model's logit, else the probability of
    label `index`."""
    if logits.shape[-1] == 1:
        return sigmoid(logits[:, 0])
    return softmax(logits)[:, index]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ranks by order; ties among float scores are rare)."""
    if len(a) < 2:
        return 1.0
    ra = np.argsort(np.argsort(a)).astype(np.float64)
    rb = np.argsort(np.argsort(b)).astype(np.float64)
    return float(np.corrcoef(ra, rb)[0, 1])
