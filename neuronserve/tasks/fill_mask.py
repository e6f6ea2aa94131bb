"""fill-mask: the `top_k` most likely tokens for each mask token, with their
probabilities and the text with the mask filled, as the `transformers` fill-mask
pipeline answers.

The compiled module returns, per token, the probabilities and ids of the `max_top_k`
(spec) most likely tokens rather than logits over the vocabulary: the server moves 2 x
max_top_k numbers per token instead of the vocabulary's size.
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
    positive_int,
    stacked,
)

if TYPE_CHECKING:
    import torch


class FillMask(JsonResultsTask):
    auto_class = "AutoModelForMaskedLM"
    name = "fill-mask"
    per_token = True
    parameters = frozenset({"top_k"})

    def check_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"top_k": positive_int(parameters, "top_k", 5)}

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        if options.get("mask_token_id") is None:
            raise ValueError(f"{model_dir}'s tokenizer has no mask token: it cannot fill masks")
        from .heads import TopTokens

        config: Any = model.config
        k = min(int(options["max_top_k"]), int(config.vocab_size))
        return WrappedModel(
            module=TopTokens(model, options["input_names"], k).eval(),
            output_name="top_tokens",
            manifest_fields={
                "labels": None,
                "pooling": None,
                "normalize": None,
                "task_settings": {"max_top_k": k},
            },
        )

    def compared(self, outputs: np.ndarray) -> np.ndarray:
        # the probabilities: tokens of equal probability may come in either order
        return outputs[..., : outputs.shape[-1] // 2]

    accuracy_metric = "top1_agreement"
    accuracy_floor_field = "min_top1_agreement"

    def accuracy(self, got: Any, want: Any) -> dict[str, float]:
        g, w = stacked(got), stacked(want)
        k = g.shape[-1] // 2
        return {**super().accuracy(got, want), "top1_agreement": float((g[:, k] == w[:, k]).mean())}

    def check_encoded(
        self, encoded: Sequence[Sequence[Any]], request: TaskRequest, info: dict[str, Any]
    ) -> RequestError | None:
        top_k, most = request.parameters.get("top_k", 5), info.get("max_top_k", 0)
        if top_k > most:
            return RequestError(
                f'"top_k" {top_k} is more than this model was compiled to return ({most}; '
                "compile with a larger max_top_k)"
            )
        mask = info["mask_token_id"]
        for k, windows in enumerate(encoded):
            if mask not in windows[0].ids:
                token = info["tokenizer"].id_to_token(mask)
                return RequestError(f"inputs[{k}] has no mask token: put {token} where a word goes")
        return None

    def finish(
        self, outputs: Any, encoded: Sequence[Sequence[Any]], request: TaskRequest, info: dict
    ) -> list[Any]:
        top_k, mask = request.parameters.get("top_k", 5), info["mask_token_id"]
        tokenizer, clean = info["tokenizer"], info.get("clean_up_spaces", False)
        results = []
        for out, windows in zip(outputs, encoded, strict=True):
            ids = list(windows[0].ids)
            positions = [i for i, t in enumerate(ids) if t == mask]
            k = out.shape[-1] // 2
            single = len(positions) == 1
            per_mask = []
            for i in positions:
                row = []
                for score, token in zip(out[i, :top_k], out[i, k : k + top_k], strict=True):
                    token = int(token)
                    filled = [*ids[:i], token, *ids[i + 1 :]]
                    row.append(
                        {
                            "score": float(score),
                            "token": token,
                            "token_str": tokenizer.decode([token], False, clean),
                            "sequence": tokenizer.decode(filled, single, clean),
                        }
                    )
                per_mask.append(row)
            results.append(per_mask[0] if single else per_mask)
        return results
