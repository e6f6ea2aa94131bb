"""The one ONNX export both CPU runtimes start from (ONNX Runtime fuses it, OpenVINO reads
it): the task's module with eager attention, dynamic batch (and sequence) axes, inputs
in the manifest's order. Attention is only recognised as one pattern (ONNX Runtime's
Attention fusion, OpenVINO's SDPA) when the model is exported with eager attention: the
default sdpa export hides it behind masking code, hence the switch before export.

A CPU compile builds up to five candidates from it (ONNX Runtime fp32 and int8, OpenVINO
fp32, bf16 and int8): `exported` makes it once per module and inputs, and keeps it, in a
folder of this user's own, for as long as the module lives."""

from __future__ import annotations

import copy
import hashlib
import shutil
import tempfile
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch

OPSET = 17
EXPORTED = "model.onnx"

# module -> (input names, per_token, the inputs' shapes, types and values) -> (the
# export's path, the model's config)
_EXPORTS: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, tuple[Path, Any]]] = (
    weakref.WeakKeyDictionary()
)


def hf_model(module: torch.nn.Module) -> Any:
    """The Hugging Face model inside a task's module (it holds the config)."""
    for sub in module.modules():
        if hasattr(sub, "config") and hasattr(sub, "set_attn_implementation"):
            return sub
    raise ValueError("no Hugging Face model inside the module to export")


def export_eager_attention(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: list[str],
    path: Path,
    per_token: bool = False,
) -> Any:
    """Write `module` as ONNX to `path`, with eager attention, and return the model's
    config. `per_token`: the output has a sequence axis as well."""
    module = copy.deepcopy(module).eval()
    hf = hf_model(module)
    hf.set_attn_implementation("eager")
    names = input_names[: len(example)]
    # token inputs vary in batch and length; an image's pixels only in batch
    axes = {n: {0: "batch"} if n == "pixel_values" else {0: "batch", 1: "sequence"} for n in names}
    # per token: as many rows as tokens, or one more (a token-embeddings module's pooled row)
    axes["output"] = {0: "batch", 1: "rows"} if per_token else {0: "batch"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings from transformers' masking code
        torch.onnx.export(
            module,
            example,
            str(path),
            input_names=names,
            output_names=["output"],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    return hf.config


def exported(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: list[str],
    per_token: bool = False,
) -> tuple[Path, Any]:
    """(`module` exported as ONNX by `export_eager_attention`, the model's config): the
    export of an earlier call with the same module and inputs, while the module lives.
    The file is read, never written, by those who ask for it."""
    names = tuple(input_names[: len(example)])
    # tracing can freeze a value-dependent branch into the graph: the inputs' values
    # decide the export as much as their shapes
    inputs = tuple(
        (tuple(t.shape), str(t.dtype), hashlib.sha256(t.numpy().tobytes()).hexdigest())
        for t in example
    )
    key = (names, per_token, inputs)
    known = _EXPORTS.setdefault(module, {})
    if key not in known or not known[key][0].is_file():
        folder = Path(tempfile.mkdtemp(prefix="neuronserve-onnx-"))
        weakref.finalize(module, shutil.rmtree, folder, True)
        config = export_eager_attention(module, example, list(names), folder / EXPORTED, per_token)
        known[key] = (folder / EXPORTED, config)
    return known[key]
