"""The model heads: torch modules around a Hugging Face model that take plain tensors
and return the one float tensor the execution path unpads. Compile wraps a model in one
(Task.wrap) and traces it; workers run what was compiled. Nothing that only parses
requests (the front) imports this module, so it never pays torch's import.
"""

from __future__ import annotations

from typing import Any

import torch


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
    def __init__(
        self, model: torch.nn.Module, pooling: str, normalize: bool, input_names: list[str]
    ):
        super().__init__(model, input_names)
        self.cls_pooling = pooling == "cls"
        self.normalize = normalize

    def head(self, out: Any, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = out.last_hidden_state
        if self.cls_pooling:
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=-1)
        return pooled.float()


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
