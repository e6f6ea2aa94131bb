"""Per-task adapters: request -> texts, model outputs -> response."""

from __future__ import annotations

from .base import RequestError, Task, TaskRequest, WrappedModel, decode_payload
from .feature_extraction import FeatureExtraction
from .fill_mask import FillMask
from .image import ImageClassification, ImageFeatureExtraction
from .question_answering import QuestionAnswering
from .rerank import Rerank
from .text_classification import TextClassification
from .token_classification import TokenClassification

TASKS: dict[str, type[Task]] = {
    t.name: t
    for t in (
        FeatureExtraction,
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


__all__ = [
    "TASKS",
    "RequestError",
    "Task",
    "TaskRequest",
    "WrappedModel",
    "decode_payload",
    "get_task",
]
