"""What text-embeddings-inference's routes share beyond the request and answer shapes:
inputs as texts or token ids, cosine similarity, and a SPLADE answer as a whole vector.

TEI takes a text as token ids too; it decodes them and encodes the text again. Here the
ids are decoded without their special tokens, which the worker adds back as it tokenizes
every text: ids that carry the model's special tokens come out the same; ids sent without
them get them (TEI would leave them out).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...served import ServedModel
from ...tasks import RequestError
from ...tasks.base import FLOAT32_JSON_BYTES


def texts_of(
    model: ServedModel, inputs: Any, field: str = "inputs", cut: dict[str, Any] | None = None
) -> tuple[list[str], bool]:
    """(texts, whether one was sent) of TEI's Input: a text, token ids, or a list of them.
    `cut`: the request's truncation parameters (truncate, truncation_direction)."""
    one = isinstance(inputs, str) or (bool(inputs) and all(isinstance(i, int) for i in inputs))
    items = [inputs] if one else list(inputs)
    if not items:
        raise RequestError(f"{field} is an empty list: send at least one text", kind="Empty")
    cut = cut or {}
    return [text_of(model, item, f"{field}[{i}]", cut) for i, item in enumerate(items)], one


def text_of(model: ServedModel, item: str | list[int], where: str, cut: dict[str, Any]) -> str:
    """A text, or the text of token ids: only as many ids as the model reads are decoded
    (those a cut keeps), and more without a cut are refused, so that a cheap list of ids
    costs no more than the text it stands for."""
    if isinstance(item, str):
        return item
    limit = model.manifest.grid.max_seq
    if len(item) > limit:
        if not cut.get("truncate", model.truncation):
            raise RequestError(
                f"{where} holds {len(item)} token ids; {model.name} reads at most {limit}: "
                'send fewer, or ask for them to be cut ("truncate": true)',
                status=413,
            )
        item = item[-limit:] if cut.get("truncation_direction") == "left" else item[:limit]
    return decoded(model, item, where, skip_special_tokens=True)


def decoded(model: ServedModel, ids: list[int], where: str, skip_special_tokens: bool) -> str:
    """The text of token ids, by the model's tokenizer; an id beyond its vocabulary is a
    tokenizer error (422)."""
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise RequestError(f"{model.name} reads images, not token ids", status=424)
    size = tokenizer.vocab_size
    beyond = next((t for t in ids if t >= size), None)
    if beyond is not None:
        raise RequestError(
            f"{where} holds token id {beyond}; {model.name}'s vocabulary has {size} ids",
            kind="Tokenizer",
        )
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, clean_up=False)


def cosine_similarities(source: np.ndarray, others: np.ndarray) -> list[float]:
    """The cosine of each row of `others` with `source`."""
    norms = np.linalg.norm(others, axis=1) * np.linalg.norm(source)
    return (others @ source / np.maximum(norms, 1e-12)).astype(float).tolist()


def sparse_cosine_similarities(answer: list[list[dict[str, Any]]]) -> list[float]:
    """The cosine of each text's SPLADE terms (answer[1:]) with the first text's, from the
    terms alone: memory as the answer's non-zero terms, not texts x vocabulary."""
    source = {t["index"]: float(t["value"]) for t in answer[0]}
    source_norm = float(np.sqrt(sum(v * v for v in source.values())))
    out = []
    for terms in answer[1:]:
        dot = sum(float(t["value"]) * source.get(t["index"], 0.0) for t in terms)
        norm = float(np.sqrt(sum(float(t["value"]) ** 2 for t in terms))) * source_norm
        out.append(dot / max(norm, 1e-12))
    return out


# bytes a zero of a whole SPLADE vector takes as JSON ("0.0,") and in the front's array
ZERO_JSON_BYTES = 4


def dense_bytes(texts: int, size: int, terms: int = 0) -> int:
    """At most how many bytes texts' whole SPLADE vectors of `size` weights take, as the
    front's float32 array and as JSON, `terms` of them not zero."""
    return texts * size * ZERO_JSON_BYTES + terms * FLOAT32_JSON_BYTES


def sparse_as_dense(answer: list[list[dict[str, Any]]], size: int) -> np.ndarray:
    """SPLADE answers (each text's non-zero terms) as whole vectors of `size` weights."""
    vectors = np.zeros((len(answer), size), dtype=np.float32)
    for row, terms in zip(vectors, answer, strict=True):
        for t in terms:
            row[t["index"]] = t["value"]
    return vectors
