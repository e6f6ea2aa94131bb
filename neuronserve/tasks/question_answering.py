"""question-answering (extractive): the answer span in a context, as the `transformers`
question-answering pipeline (4.x, removed in 5) found it: softmax over the context's
start and end logits, spans of at most `max_answer_len` tokens scored start x end,
widened to whole words, `top_k` best, an empty answer when `handle_impossible_answer`
and the model prefers it.

A context longer than the largest bucket is never cut: the tokenizer splits it into
windows of the largest bucket that overlap by `doc_stride` tokens (each holding the whole
question), every window is a row of the one execution path, and the best span over all
windows wins.
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
    Text,
    WrappedModel,
    boolean,
    positive_int,
    truncation_parameters,
)

if TYPE_CHECKING:
    import torch


class QuestionAnswering(JsonResultsTask):
    auto_class = "AutoModelForQuestionAnswering"
    name = "question-answering"
    accepts_pairs = True
    pairs_required = True
    per_token = True
    windowed = True
    body_fields = ("question", "context")
    parameters = frozenset(
        {"top_k", "max_answer_len", "handle_impossible_answer", "doc_stride", "align_to_words"}
    )

    def parse(self, inputs: Any, parameters: dict[str, Any]) -> TaskRequest:
        single = not isinstance(inputs, list)
        items = [inputs] if single else inputs
        if not items:
            raise RequestError('"inputs" is an empty list: send at least one question')
        texts: list[Text] = [
            _pair(item, f"inputs[{i}]" if not single else "the request")
            for i, item in enumerate(items)
        ]
        truncate, direction = truncation_parameters(parameters)
        return TaskRequest(
            texts=texts,
            single=single,
            parameters=self.own_parameters(parameters),
            truncate=truncate,
            truncation_direction=direction,
        )

    def check_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        return {
            "top_k": positive_int(parameters, "top_k", 1),
            "max_answer_len": positive_int(parameters, "max_answer_len", 15),
            "handle_impossible_answer": boolean(parameters, "handle_impossible_answer", False),
            "doc_stride": positive_int(parameters, "doc_stride", None),
            "align_to_words": boolean(parameters, "align_to_words", True),
        }

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        from .heads import SpanLogits

        return WrappedModel(
            module=SpanLogits(model, options["input_names"]).eval(),
            output_name="span_logits",
            manifest_fields={"labels": None, "pooling": None, "normalize": None},
        )

    accuracy_metric = "span_agreement"
    accuracy_floor_field = "min_span_agreement"

    def accuracy(self, got: Any, want: Any) -> dict[str, float]:
        agree = [best_span(g) == best_span(w) for g, w in zip(got, want, strict=True)]
        return {**super().accuracy(got, want), "span_agreement": float(np.mean(agree))}

    def finish(
        self, outputs: Any, encoded: Sequence[Sequence[Any]], request: TaskRequest, info: dict
    ) -> list[Any]:
        p = request.parameters
        results, pos = [], 0
        for text, windows in zip(request.texts, encoded, strict=True):
            context = str(text[1])
            rows = outputs[pos : pos + len(windows)]
            pos += len(windows)
            answers: list[dict[str, Any]] = []
            null = float("inf")
            for logits, window in zip(rows, windows, strict=True):
                found, window_null = window_answers(logits, window.source, context, p)
                answers += found
                null = min(null, window_null)
            if p["handle_impossible_answer"]:
                answers.append({"score": null, "start": 0, "end": 0, "answer": ""})
            answers = sorted(answers, key=lambda a: a["score"], reverse=True)[: p["top_k"]]
            results.append(answers[0] if len(answers) == 1 else answers)
        return results


def _pair(item: Any, where: str) -> tuple[str, str]:
    if not isinstance(item, dict) or "question" not in item or "context" not in item:
        raise RequestError(
            f'{where} must hold "question" and "context" (e.g. {{"question": "...", '
            '"context": "..."}})'
        )
    unknown = set(item) - {"question", "context"}
    if unknown:
        raise RequestError(f"{where} has unknown fields {sorted(unknown)}")
    for name in ("question", "context"):
        if not isinstance(item[name], str):
            raise RequestError(
                f'{where}: "{name}" must be a string, got {type(item[name]).__name__}'
            )
        if not item[name].strip():
            raise RequestError(f'{where}: "{name}" is empty')
    return item["question"], item["context"]


def _normalized(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    x = np.where(allowed, logits, np.float32(-10000.0))
    x = np.exp(x - x.max())
    return x / x.sum()


def window_answers(
    logits: np.ndarray, encoding: Any, context: str, p: dict[str, Any]
) -> tuple[list[dict[str, Any]], float]:
    """One window's top_k spans in the context (character offsets into the context as
    sent) and its null score (start x end probability of the first token)."""
    sequence_ids = encoding.sequence_ids
    allowed = np.array([s == 1 for s in sequence_ids])
    allowed[0] = True  # the pipeline keeps the first (CLS) token: the "no answer" span
    start = _normalized(logits[:, 0], allowed)
    end = _normalized(logits[:, 1], allowed)
    null = float(start[0] * end[0])
    start[0] = end[0] = 0.0
    answers = []
    for s, e, score in decode_spans(start, end, p["top_k"], p["max_answer_len"], allowed):
        begin, stop = _chars(encoding, s, e, p["align_to_words"])
        answers.append(
            {"score": float(score), "start": begin, "end": stop, "answer": context[begin:stop]}
        )
    return answers, null


def decode_spans(
    start: np.ndarray, end: np.ndarray, top_k: int, max_len: int, allowed: np.ndarray
) -> list[tuple[int, int, float]]:
    """The top_k (start, end) pairs by start x end with start <= end < start + max_len,
    both allowed (the pipeline's decode_spans)."""
    candidates = np.tril(np.triu(np.outer(start, end)), max_len - 1)
    flat = candidates.flatten()
    if top_k == 1:
        order = np.array([np.argmax(flat)])
    elif len(flat) < top_k:
        order = np.argsort(-flat)
    else:
        order = np.argpartition(-flat, top_k)[:top_k]
        order = order[np.argsort(-flat[order])]
    starts, ends = np.unravel_index(order, candidates.shape)
    return [
        (int(s), int(e), float(candidates[s, e]))
        for s, e in zip(starts, ends, strict=True)
        if allowed[s] and allowed[e]
    ]


def _chars(encoding: Any, s: int, e: int, align_to_words: bool) -> tuple[int, int]:
    """Character span of tokens s..e in the context, widened to whole words."""
    if align_to_words:
        start_word, end_word = encoding.token_to_word(s), encoding.token_to_word(e)
        if start_word is not None and end_word is not None:
            begin = encoding.word_to_chars(start_word, 1)
            stop = encoding.word_to_chars(end_word, 1)
            if begin is not None and stop is not None:
                return int(begin[0]), int(stop[1])
    return int(encoding.offsets[s][0]), int(encoding.offsets[e][1])


def best_span(logits: np.ndarray, max_len: int = 15) -> tuple[int, int]:
    """The highest start x end span over all tokens (the accuracy check's span)."""
    start = np.exp(logits[:, 0] - logits[:, 0].max())
    end = np.exp(logits[:, 1] - logits[:, 1].max())
    candidates = np.tril(np.triu(np.outer(start, end)), max_len - 1)
    s, e = np.unravel_index(int(np.argmax(candidates)), candidates.shape)
    return int(s), int(e)
