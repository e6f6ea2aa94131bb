"""What one request of a bench point holds, for every task: built once per point from the
sweep's text of `seq` tokens and the texts-per-request count, then handed to each
endpoint in the form that endpoint speaks (a native JSON body, the
`transformers` pipeline's arguments).

    feature-extraction, text-classification, token-classification: n texts
    fill-mask:           n texts, each with a mask token in the middle
    rerank:              one query and n documents of `seq` tokens
    question-answering:  n questions, each with a context of `seq` tokens (windowed by
                         the server beyond its largest bucket)
    image-*:             n images (the sweep's length is the model's image size)
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

QUERY = "which of these is about the river bank?"
QUESTION = "What did the committee decide?"


@dataclass(frozen=True)
class Batch:
    """One bench request of `task`: `items` are texts, (query, document) or (question,
    context) pairs, or encoded images."""

    task: str
    items: tuple[Any, ...]

    @property
    def texts(self) -> list[str]:
        """The texts (OpenAI's input field; the embedding routes)."""
        return [str(x) for x in self.items]

    @cached_property
    def native(self) -> bytes:
        """The JSON body TorchServe, SageMaker, the front's /invocations and the Runner take."""
        items = list(self.items)
        body: dict[str, Any]
        if self.task == "rerank":
            body = {"query": items[0][0], "documents": [d for _, d in items]}
        elif self.task == "question-answering":
            qa = [{"question": q, "context": c} for q, c in items]
            body = {"inputs": qa[0] if len(qa) == 1 else qa}
        elif self.task.startswith("image-"):
            images = [base64.b64encode(x).decode() for x in items]
            body = {"inputs": images[0] if len(images) == 1 else images}
        else:
            body = {"inputs": items[0] if len(items) == 1 else items}
        return json.dumps(body).encode()


def with_mask(text: str, mask: str) -> str:
    """`text` with its middle word replaced by the mask token."""
    words = text.split()
    words[len(words) // 2] = mask
    return " ".join(words)


def mask_token(tokenizer_file: Path) -> str:
    """The tokenizer's mask token ([MASK], <mask>), from tokenizer.json's added tokens."""
    added = json.loads(Path(tokenizer_file).read_text()).get("added_tokens", [])
    for t in added:
        if "mask" in t["content"].lower():
            return str(t["content"])
    raise ValueError(f"{tokenizer_file} has no mask token: it cannot drive fill-mask")


class Work:
    """Builds each point's Batch for one task from the sweep's texts of each length."""

    def __init__(self, task: str, texts: dict[int, str], mask: str | None = None):
        self.task, self.texts, self.mask = task, texts, mask
        self._images: list[bytes] | None = None

    def batch(self, seq: int, n: int) -> Batch:
        if self.task.startswith("image-"):
            if self._images is None:
                from ..images import sample_images

                # small images (about a 224-pixel photo's size): decoding is part of the work
                self._images = [b for b in sample_images(15, seed=1) if len(b) < 200_000]
            return Batch(self.task, tuple(self._images[i % len(self._images)] for i in range(n)))
        text = self.texts[seq]
        if self.task == "rerank":
            return Batch(self.task, tuple((QUERY, text) for _ in range(n)))
        if self.task == "question-answering":
            return Batch(self.task, tuple((QUESTION, text) for _ in range(n)))
        if self.task == "fill-mask":
            text = with_mask(text, self.mask or "[MASK]")
        return Batch(self.task, tuple(text for _ in range(n)))


class Vanilla:
    """The baseline a user would write with `transformers`: its pipeline for the task on
    the eager fp32 model, called with one request's items. Rerank is the text-
    classification pipeline on the pairs, sorted; question answering (whose pipeline
    transformers 5 removed) the tokenizer's overflowing windows and the eager model, the
    best start x end span kept."""

    def __init__(self, model_dir: Path, task: str):
        from transformers import pipeline

        make: Any = pipeline  # its overloads are typed per task literal; ours is a str
        self.task = task
        if task == "question-answering":
            from transformers import AutoModelForQuestionAnswering, AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
            self.model = AutoModelForQuestionAnswering.from_pretrained(model_dir).eval()
            return
        name = "text-classification" if task == "rerank" else task
        kwargs = {} if task.startswith("image-") else {"tokenizer": str(model_dir)}
        self.pipe = make(name, model=str(model_dir), device="cpu", **kwargs)

    def arguments(self, batch: Batch) -> Any:
        items = list(batch.items)
        if self.task == "rerank":
            return [{"text": q, "text_pair": d} for q, d in items]
        if self.task.startswith("image-"):
            return [base64.b64encode(x).decode() for x in items]
        if self.task == "question-answering":
            return items
        return items[0] if len(items) == 1 else items

    def __call__(self, arguments: Any) -> Any:
        if self.task == "question-answering":
            return [self._answer(q, c) for q, c in arguments]
        out = self.pipe(arguments)
        if self.task == "rerank":
            scores = [r["score"] if isinstance(r, dict) else r[0]["score"] for r in out]
            return sorted(range(len(scores)), key=lambda i: -scores[i])
        return out

    def _answer(self, question: str, context: str) -> tuple[int, int]:
        import torch

        enc = self.tokenizer(
            question,
            context,
            truncation="only_second",
            max_length=min(self.tokenizer.model_max_length, 384),
            stride=128,
            return_overflowing_tokens=True,
            return_tensors="pt",
            padding=True,
        )
        enc.pop("overflow_to_sample_mapping", None)
        with torch.no_grad():
            out = self.model(**enc)
        start, end = out.start_logits.softmax(-1), out.end_logits.softmax(-1)
        scores = torch.triu(start[:, :, None] * end[:, None, :]).tril(14)
        best = int(scores.flatten().argmax())
        seq = scores.shape[-1]
        return (best // seq) % seq, best % seq
