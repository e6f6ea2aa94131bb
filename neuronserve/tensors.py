"""Each task's results as named tensors, for servers that speak tensors (KServe v2: Triton's
own API): what a request carries and what an answer is, and how a task's results
(`Task.finish`) become those tensors (the Triton backend's answers).

Inputs: TEXT (BYTES, [n, 1]), with TEXT_PAIR for a task that takes pairs, or IMAGE
(encoded images) for an image task. Outputs, one row (or element) per text:

    embeddings        EMBEDDING (float32, [dim]); every token's vector: TOKEN_EMBEDDINGS
                      (bytes: a float32 tokens x dim matrix per text); TOKENS (int32,
                      [1]): the tokens the model read of each text (a text model's)
    classification    LOGITS, SCORES (the task's default function), LABEL (the best)
    rerank            LOGITS, SCORE (the relevance)
    the others        one BYTES element of JSON per text (ENTITIES, ANSWERS, PREDICTIONS,
                      TERMS)

The first output of a task is the model's rows (or results): what a client reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TOKEN_EMBEDDINGS = "TOKEN_EMBEDDINGS"
TOKENS = "TOKENS"
PAIR_INPUT = "TEXT_PAIR"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name, or "bytes"
    dims: tuple[int, ...]  # per text, without the batch dimension


def bytes_element(value: str | bytes) -> bytes:
    """One element of a BYTES tensor: text as UTF-8, bytes (an encoded image) as they are."""
    return value if isinstance(value, bytes) else value.encode()


def bytes_rows(values: Sequence[str | bytes]) -> np.ndarray:
    """A BYTES tensor of one element per row ([n, 1]) (`bytes_element`)."""
    return np.array([[bytes_element(v)] for v in values], dtype=object)


class TaskTensors:
    """One kind of task's tensors: its outputs, how its results become them, and back."""

    # whether its answers carry TOKENS, each text's token count (what OpenAI's usage
    # reports), as the Runner counted them while tokenizing
    counts_tokens = False

    def outputs(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        raise NotImplementedError

    def encode(self, results: Any, info: dict[str, Any]) -> dict[str, np.ndarray]:
        raise NotImplementedError


class Embeddings(TaskTensors):
    counts_tokens = True

    def outputs(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        # token embeddings: each text's (tokens x dim) float32 matrix as bytes, one element
        # per text (texts differ in length, a tensor's rows may not)
        return [
            TensorSpec("EMBEDDING", "float32", (output_dim,)),
            TensorSpec(TOKEN_EMBEDDINGS, "bytes", (1,)),
            TensorSpec(TOKENS, "int32", (1,)),
        ]

    def encode(self, results: Any, info: dict[str, Any]) -> dict[str, np.ndarray]:
        if isinstance(results, list):
            return {TOKEN_EMBEDDINGS: bytes_rows([r.astype("<f4").tobytes() for r in results])}
        return {"EMBEDDING": results.astype(np.float32)}


class Classification(TaskTensors):
    def outputs(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        return [
            TensorSpec("LOGITS", "float32", (output_dim,)),
            TensorSpec("SCORES", "float32", (output_dim,)),
            TensorSpec("LABEL", "bytes", (1,)),
        ]

    def encode(self, results: Any, info: dict[str, Any]) -> dict[str, np.ndarray]:
        from .tasks.text_classification import FUNCTIONS, default_function

        labels = info["labels"]
        best = np.argmax(results, axis=-1)
        function = FUNCTIONS[default_function(labels, bool(info.get("multi_label")))]
        return {
            "LOGITS": results.astype(np.float32),
            "SCORES": function(results).astype(np.float32),
            "LABEL": bytes_rows([labels[i] for i in best]),
        }


class Rerank(TaskTensors):
    def outputs(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        return [
            TensorSpec("LOGITS", "float32", (output_dim,)),
            TensorSpec("SCORE", "float32", (1,)),
        ]

    def encode(self, results: Any, info: dict[str, Any]) -> dict[str, np.ndarray]:
        from .tasks.rerank import relevance

        score = relevance(results, int(info.get("relevance_index", 0)))
        return {
            "LOGITS": np.asarray(results, dtype=np.float32),
            "SCORE": score.astype(np.float32).reshape(-1, 1),
        }


@dataclass(frozen=True)
class JsonResults(TaskTensors):
    """A result per text that is JSON built in the worker (entities, answers,
    predictions, terms): one BYTES element per text."""

    name: str

    def outputs(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        return [TensorSpec(self.name, "bytes", (1,))]

    def encode(self, results: Any, info: dict[str, Any]) -> dict[str, np.ndarray]:
        return {self.name: bytes_rows([json.dumps(r, ensure_ascii=False) for r in results])}


_BY_TASK: dict[str, TaskTensors] = {
    "feature-extraction": Embeddings(),
    "image-feature-extraction": Embeddings(),
    "text-classification": Classification(),
    "image-classification": Classification(),
    "rerank": Rerank(),
    "token-classification": JsonResults("ENTITIES"),
    "question-answering": JsonResults("ANSWERS"),
    "fill-mask": JsonResults("PREDICTIONS"),
    "sparse-embedding": JsonResults("TERMS"),
}


def of(task: str) -> TaskTensors:
    """Task `task`'s tensors."""
    return _BY_TASK[task]


def results_tensors(
    task: str, results: Any, info: dict[str, Any], tokens: list[int] | None
) -> dict[str, np.ndarray]:
    """One request's results as `task`'s tensors, with TOKENS when the task answers them
    and the worker counted the request's tokens."""
    codec = of(task)
    arrays = codec.encode(results, info)
    if codec.counts_tokens and tokens is not None:
        arrays[TOKENS] = np.asarray(tokens, dtype=np.int32).reshape(-1, 1)
    return arrays


def input_name(task: str) -> str:
    """The tensor a request's texts (or images) travel in."""
    from .tasks import get_task

    return "IMAGE" if get_task(task).images else "TEXT"
