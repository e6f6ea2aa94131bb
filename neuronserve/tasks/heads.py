"""The model heads: torch modules around a Hugging Face model that take plain tensors
and return the one float tensor the execution path unpads. Compile wraps a model in one
(Task.wrap) and traces it; workers run what was compiled. Nothing that only parses
requests (the front) imports this module, so it never pays torch's import.
"""

from __future__ import annotations

from typing import Any

import torch


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, cls: bool) -> torch.Tensor:
    """sentence-transformers' Pooling of token states: the first token's (cls), or the
    mean over the tokens the attention mask keeps (mean)."""
    if cls:
        return hidden[:, 0]
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


class EncoderModule(torch.nn.Module):
    """Base of the per-task modules that get compiled: plain int64 tensors in, the
    Hugging Face model called with the inputs it takes, and the task's `head` turning its
    output into the one float tensor the execution path unpads."""

    def __init__(self, model: torch.nn.Module, input_names: list[str]):
        super().__init__()
        self.model = model
        self.uses_token_types = "token_type_ids" in input_names

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        kwargs: dict[str, torch.Tensor | None] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
        }
        if self.uses_token_types:
            kwargs["token_type_ids"] = token_type_ids
        return self.head(self.model(**kwargs), attention_mask)

    def head(self, out: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class PooledEncoder(EncoderModule):
    """Pooling, then sentence-transformers' Dense layers (`dense`, in order) and
    Normalize, as its modules.json lists them. With `tokens`, every token's hidden state
    follows the pooled vector: (batch, 1 + tokens, dim)."""

    def __init__(  # noqa: PLR0913 - the model, and each module after it
        self,
        model: torch.nn.Module,
        pooling: str,
        normalize: bool,
        input_names: list[str],
        dense: torch.nn.Module | None = None,
        tokens: bool = False,
    ):
        super().__init__(model, input_names)
        self.cls_pooling = pooling == "cls"
        self.normalize = normalize
        self.dense = dense if dense is not None else torch.nn.Identity()
        self.tokens = tokens

    def head(self, out: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = out.last_hidden_state
        pooled = self.dense(pool(hidden, attention_mask, self.cls_pooling))
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=-1)
        if self.tokens:
            return torch.cat((pooled.unsqueeze(1), hidden), dim=1).float()
        return pooled.float()


class SpladeEncoder(EncoderModule):
    """SPLADE: a masked-LM's logits over the real tokens, log(1 + relu(.)) (twice with
    `log1p_relu`), then max (or sum) over the tokens: one vocabulary-sized vector per
    text, so only that leaves the device (sentence-transformers' SpladePooling)."""

    def __init__(
        self, model: torch.nn.Module, input_names: list[str], strategy: str, activation: str
    ):
        super().__init__(model, input_names)
        self.use_max = strategy == "max"
        self.twice = activation == "log1p_relu"

    def head(self, out: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = out.logits.float() * attention_mask.unsqueeze(-1).to(torch.float32)
        weights = torch.log1p(torch.relu(logits))
        if self.twice:
            weights = torch.log1p(weights)
        # padded positions weigh 0, which neither max (every weight is >= 0) nor sum changes
        return weights.amax(dim=1) if self.use_max else weights.sum(dim=1)


def dense_layers(layers: list[tuple[torch.nn.Linear, str]]) -> torch.nn.Module:
    """sentence-transformers' Dense modules as one torch module: each a linear map, then
    its activation (identity, tanh, relu, gelu)."""
    activations = {
        "identity": torch.nn.Identity,
        "tanh": torch.nn.Tanh,
        "relu": torch.nn.ReLU,
        "gelu": torch.nn.GELU,
    }
    return torch.nn.Sequential(*(m for linear, act in layers for m in (linear, activations[act]())))


class LogitsClassifier(EncoderModule):
    def head(self, out: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        return out.logits.float()


class SpanLogits(EncoderModule):
    def head(self, out: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        return torch.stack((out.start_logits, out.end_logits), dim=-1).float()


class TopTokens(EncoderModule):
    def __init__(self, model: torch.nn.Module, input_names: list[str], k: int):
        super().__init__(model, input_names)
        self.k = k

    def head(self, out: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        values, ids = out.logits.float().softmax(dim=-1).topk(self.k, dim=-1)
        # token ids are exact in float32 below 2**24: any vocabulary
        return torch.cat((values, ids.float()), dim=-1)


class PixelModule(torch.nn.Module):
    """The Hugging Face vision model called with pixel_values, as compiled."""

    def __init__(self, model: torch.nn.Module, head: str):
        super().__init__()
        self.model, self.head = model, head

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.model(pixel_values=pixel_values)
        if self.head == "logits":
            return out.logits.float()
        hidden = out.last_hidden_state
        pooled = hidden[:, 0] if self.head == "cls" else hidden.mean(dim=1)
        return pooled.float()
