"""token-classification (NER): a label per token, grouped into entities the way the
`transformers` token-classification pipeline groups them (aggregation_strategy none,
simple, first, average, max), with character offsets into the text as it was sent.

The compiled module returns logits per token; the execution path unpads them along the
sequence, and entities are built in the worker, where the token offsets are (the Rust
tokenizer's, in characters of the text sent, so they hold for any unicode and for text
cut by truncation).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import (
    JsonResultsTask,
    RequestError,
    TaskRequest,
    WrappedModel,
    logits_over_labels,
    stacked,
)

if TYPE_CHECKING:
    import torch

STRATEGIES = ("none", "simple", "first", "average", "max")


class TokenClassification(JsonResultsTask):
    auto_class = "AutoModelForTokenClassification"
    name = "token-classification"
    per_token = True
    uses_offsets = True
    parameters = frozenset({"aggregation_strategy", "ignore_labels"})

    def check_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        strategy = parameters.get("aggregation_strategy", "none")
        if isinstance(strategy, str):
            strategy = strategy.lower()
        if strategy not in STRATEGIES:
            raise RequestError(
                f'"aggregation_strategy" must be one of {STRATEGIES}, got {strategy!r}'
            )
        ignore = parameters.get("ignore_labels", ["O"])
        if isinstance(ignore, str):  # how a list travels as a Triton request parameter
            ignore = [x for x in ignore.split(",") if x]
        if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
            raise RequestError('"ignore_labels" must be a list of label names')
        return {"aggregation_strategy": strategy, "ignore_labels": ignore}

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        from .heads import LogitsClassifier

        return logits_over_labels(LogitsClassifier(model, options["input_names"]), model.config)

    accuracy_metric = "token_argmax_agreement"
    accuracy_floor_field = "min_argmax_agreement"

    def accuracy(self, got: Any, want: Any) -> dict[str, float]:
        g, w = stacked(got), stacked(want)
        agree = np.argmax(g, axis=-1) == np.argmax(w, axis=-1)
        return {**super().accuracy(got, want), "token_argmax_agreement": float(agree.mean())}

    def finish(
        self, outputs: Any, encoded: Sequence[Sequence[Any]], request: TaskRequest, info: dict
    ) -> list[list[dict[str, Any]]]:
        p = request.parameters
        strategy = p.get("aggregation_strategy", "none")
        ignore = set(p.get("ignore_labels", ["O"]))
        results = []
        for logits, windows, text in zip(outputs, encoded, request.texts, strict=True):
            pre = pre_entities(str(text), windows[0].source, softmax32(logits), info, strategy)
            entities = aggregate(pre, strategy, info)
            results.append(
                [e for e in entities if e.get("entity", e.get("entity_group")) not in ignore]
            )
        return results


def softmax32(logits: np.ndarray) -> np.ndarray:
    """The pipeline's softmax, in float32 as it computes it."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def pre_entities(
    text: str, encoding: Any, scores: np.ndarray, info: dict, strategy: str
) -> list[dict[str, Any]]:
    """Every non-special token with its scores, text and offsets, and whether it continues
    a word (the pipeline's gather_pre_entities)."""
    tokenizer = info["tokenizer"]
    prefix = tokenizer.continuing_subword_prefix
    out = []
    for idx, (token_id, (start, end), special) in enumerate(
        zip(encoding.ids, encoding.offsets, encoding.special_tokens_mask, strict=True)
    ):
        if special:
            continue
        word = tokenizer.id_to_token(token_id)
        word_ref = text[start:end]
        if prefix:
            is_subword = len(word) != len(word_ref)
        else:  # the pipeline's heuristic for tokenizers without word pieces
            is_subword = start > 0 and " " not in text[start - 1 : start + 1]
        if token_id == info.get("unk_token_id"):
            word, is_subword = word_ref, False
        out.append(
            {
                "word": word,
                "scores": scores[idx],
                "start": start,
                "end": end,
                "index": idx,
                "is_subword": is_subword,
            }
        )
    return out


def aggregate(pre: list[dict[str, Any]], strategy: str, info: dict) -> list[dict[str, Any]]:
    labels = info["labels"]
    if strategy in ("none", "simple"):
        entities = []
        for p in pre:
            best = int(p["scores"].argmax())
            entities.append(
                {
                    "entity": labels[best],
                    "score": float(p["scores"][best]),
                    "index": p["index"],
                    "word": p["word"],
                    "start": p["start"],
                    "end": p["end"],
                }
            )
        if strategy == "none":
            return entities
        return group_entities(entities, info)
    words: list[list[dict[str, Any]]] = []
    for p in pre:
        if words and p["is_subword"]:
            words[-1].append(p)
        else:
            words.append([p])
    return group_entities([aggregate_word(w, strategy, info) for w in words], info)


def aggregate_word(tokens: list[dict[str, Any]], strategy: str, info: dict) -> dict[str, Any]:
    """One word's entity from its tokens: the first token's label, the most confident
    token's, or the label of the averaged scores."""
    labels = info["labels"]
    if strategy == "first":
        scores = tokens[0]["scores"]
    elif strategy == "max":
        scores = max(tokens, key=lambda t: t["scores"].max())["scores"]
    else:
        scores = np.nanmean(np.stack([t["scores"] for t in tokens]), axis=0)
    best = int(scores.argmax())
    return {
        "entity": labels[best],
        "score": float(scores[best]),
        "word": info["tokenizer"].tokens_to_string([t["word"] for t in tokens]),
        "start": tokens[0]["start"],
        "end": tokens[-1]["end"],
    }


def _tag(entity: str) -> tuple[str, str]:
    if entity.startswith("B-"):
        return "B", entity[2:]
    if entity.startswith("I-"):
        return "I", entity[2:]
    return "I", entity


def group_entities(entities: list[dict[str, Any]], info: dict) -> list[dict[str, Any]]:
    """Adjacent entities of one type joined (a B- starts a new one): the pipeline's
    group_entities."""
    groups: list[list[dict[str, Any]]] = []
    for e in entities:
        bi, tag = _tag(e["entity"])
        if groups and tag == _tag(groups[-1][-1]["entity"])[1] and bi != "B":
            groups[-1].append(e)
        else:
            groups.append([e])
    tokenizer = info["tokenizer"]
    return [
        {
            "entity_group": g[0]["entity"].split("-", 1)[-1],
            "score": float(np.nanmean([e["score"] for e in g])),
            "word": tokenizer.tokens_to_string([e["word"] for e in g]),
            "start": g[0]["start"],
            "end": g[-1]["end"],
        }
        for g in groups
    ]
