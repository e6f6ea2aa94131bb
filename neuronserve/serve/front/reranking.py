"""Documents ranked against a query, for every rerank route: text-embeddings-inference's
/rerank, Cohere's /v2/rerank, and /v1/rerank where Cohere's v1 and Jina's APIs agree.
One function scores the pairs (a rerank model's own task, or a one-label classifier's
sigmoid), so every route answers the same scores for the same pairs; each route only
shapes the answer its clients read.

The order rules are each API's: best first, ties in the order the documents were sent,
`top_n` cutting the list after sorting."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...tasks import RequestError

if TYPE_CHECKING:
    from ...served import ServedModel
    from .serving import Serving

# what Cohere bills one search unit for: a query with up to 100 documents
DOCUMENTS_PER_SEARCH_UNIT = 100


@dataclass(frozen=True)
class Ranked:
    """(document index, score) best first, `top_n` kept; the tokens the model read."""

    order: list[tuple[int, float]]
    tokens: int


async def ranked(  # noqa: PLR0913 - the model, the pairs, and how to score them
    serving: Serving,
    model: ServedModel,
    query: str,
    texts: list[str],
    top_n: int | None,
    raw_scores: bool = False,
    parameters: dict[str, Any] | None = None,
) -> Ranked:
    """`texts` scored against `query` by `model` (a rerank model, or a classifier with one
    label); `parameters`: truncation, as each route takes it."""
    if not texts:
        raise RequestError("documents is an empty list: send at least one document", kind="Empty")
    given = parameters or {}
    if model.task == "rerank":
        params = {"top_n": top_n, "return_documents": False, "raw_scores": raw_scores, **given}
        answer = await serving.predict(model, {"query": query, "documents": texts}, params)
        order = [(int(r["index"]), float(r["score"])) for r in answer.value]
    else:
        items = [{"text": query, "text_pair": t} for t in texts]
        function = "none" if raw_scores else "sigmoid"
        params = {"top_k": None, "function_to_apply": function, **given}
        answer = await serving.predict(model, items, params)
        scores = [float(row[0]["score"]) for row in answer.value]
        best = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]
        order = [(i, scores[i]) for i in best]
    pairs = [(query, t) for t in texts]
    return Ranked(order, await serving.count_tokens(model, pairs, answer))


def cut_documents(model: ServedModel, texts: list[str], most: int | None) -> list[str]:
    """`texts`, each cut after `most` tokens (Cohere's max_tokens_per_doc); as they are
    when none is asked, or when no document could be longer than the model reads anyway."""
    tokenizer = model.tokenizer
    if most is None or tokenizer is None or most >= tokenizer.max_length:
        return texts
    return tokenizer.cut_to_tokens(texts, most)


def results(result: Ranked, texts: list[str], documents: bool) -> list[dict[str, Any]]:
    """Cohere's and Jina's results: index, relevance_score and, when asked, the document."""
    return [
        {
            "index": i,
            "relevance_score": score,
            **({"document": {"text": texts[i]}} if documents else {}),
        }
        for i, score in result.order
    ]


def cohere_meta(result: Ranked, documents: int, version: str) -> dict[str, Any]:
    """Cohere's `meta`: its API version, the search units it bills, the tokens read."""
    units = max(1, math.ceil(documents / DOCUMENTS_PER_SEARCH_UNIT))
    return {
        "api_version": {"version": version},
        "billed_units": {"search_units": units},
        "tokens": {"input_tokens": result.tokens, "output_tokens": 0},
    }
