"""Per-task adapters: request -> texts, model outputs -> response."""

from __future__ import annotations

from pathlib import Path

from .base import RequestError, Task, TaskRequest, WrappedModel, decode_payload
from .feature_extraction import FeatureExtraction
from .fill_mask import FillMask
from .image import ImageClassification, ImageFeatureExtraction
from .question_answering import QuestionAnswering
from .rerank import Rerank
from .sentence_transformers import read_modules
from .sparse_embedding import SparseEmbedding
from .text_classification import TextClassification
from .token_classification import TokenClassification

TASKS: dict[str, type[Task]] = {
    t.name: t
    for t in (
        FeatureExtraction,
        SparseEmbedding,
        TextClassification,
        Rerank,
        TokenClassification,
        QuestionAnswering,
        FillMask,
        ImageClassification,
        ImageFeatureExtraction,
    )
}


def get_task(name: str) -> Task:
    try:
        return TASKS[name]()
    except KeyError:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}") from None


def task_for(task: str, pooling: str, model_dir: Path) -> str:
    """The task a compile builds: feature-extraction with SPLADE pooling (asked for, or a
    sentence-transformers SparseEncoder's under `auto`) is sparse-embedding."""
    if task == "feature-extraction" and (
        pooling == "splade" or (pooling == "auto" and read_modules(model_dir).splade)
    ):
        return SparseEmbedding.name
    if pooling == "splade" and task != SparseEmbedding.name:
        raise ValueError(f"pooling splade is for embedding models, not task {task}")
    return task


__all__ = [
    "TASKS",
    "RequestError",
    "Task",
    "TaskRequest",
    "WrappedModel",
    "decode_payload",
    "get_task",
    "task_for",
]
