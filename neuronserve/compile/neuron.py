"""neuron target (Inf1): torch.neuron.trace from torch_neuron, one module per bucket.

neuron-cc runs matmults in BF16 or FP16 whatever it is told: its `--fast-math none` "is
equivalent to using fp32-cast-matmult-bf16 no-fast-relayout", and casting all FP32
operators to BF16 is its default (neuron-cc CLI reference,
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/neuron-cc/command-line-reference.html;
Inferentia has "64 FP16/BF16 TFLOPS" and no FP32 matmul). So Inf1 has no fp32 precision:
bf16 maps to `--fast-math fp32-cast-matmult-bf16`, fp16 to `fp32-cast-matmult-fp16`, and
an explicit `auto_cast` to the matching --fast-math value. Pipeline mode spreads one
model over several NeuronCores (--neuroncore-pipeline-cores); a worker then needs that
many cores. Inf1 NEFFs hold their weights, so every bucket module carries its own copy.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import cores
from .neuron_sdk import NeuronTargetBase, import_sdk, weight_bytes
from .neuronx import _refuse_cast_flags

FAST_MATH = {
    ("matmult", "bf16"): "fp32-cast-matmult-bf16",
    ("matmult", "fp16"): "fp32-cast-matmult-fp16",
    ("all", "bf16"): "fp32-cast-all",
    ("all", "fp16"): "fp32-cast-all-fp16",
}


def default_pipeline_cores(model: torch.nn.Module, host_cores: int | None = None) -> int:
    """The seed's rule of thumb, 4 * round(weights / 2e7) (also the neuron-cc pipeline
    guide's), at least 1 and capped at the host's NeuronCores in multiples of 4 when they
    are known (BERT-base gives 20, more than an inf1.6xlarge's 16)."""
    weights = sum(p.numel() for p in model.parameters())
    n = max(1, 4 * round(weights / 2e7))
    if host_cores:
        n = min(n, max(4, host_cores // 4 * 4))
    return n


def fast_math(options: dict[str, Any]) -> tuple[list[str], str]:
    """(the --fast-math arguments, the precision neuron-cc then runs)."""
    cast, cast_type = options.get("auto_cast"), options.get("auto_cast_type")
    precision = options.get("precision") or "auto"
    if cast_type == "tf32":
        raise ValueError("auto_cast_type tf32 is not available on Inf1: use bf16 or fp16")
    if precision == "fp32" or (precision not in ("auto", "bf16", "fp16")):
        raise ValueError(
            f"target neuron (Inf1) has no precision {precision}: neuron-cc runs matmults in "
            "BF16 or FP16 even with --fast-math none; choose bf16, fp16 or auto"
        )
    if cast == "none":
        return ["--fast-math", "none"], "bf16"
    if cast is not None:
        type_ = cast_type or "bf16"
        return ["--fast-math", FAST_MATH[cast, type_]], type_
    type_ = "bf16" if precision == "auto" else precision
    return ["--fast-math", FAST_MATH["matmult", type_]], type_


def compiler_args(options: dict[str, Any], model: torch.nn.Module | None = None) -> list[str]:
    if options.get("optlevel"):
        raise ValueError("optlevel is a neuronx-cc (Inf2/Trn1) option; neuron-cc has none")
    if options.get("compile_for"):
        raise ValueError(
            "compile_for names an Inf2/Trn platform; neuron-cc (Inf1) compiles on any host "
            "without it (validate the artifact on the Inf1 host with `neuronserve validate`)"
        )
    args, _ = fast_math(options)
    _refuse_cast_flags(options)
    pipeline = options.get("pipeline_cores")
    if pipeline == "auto":
        if model is None:
            raise ValueError("pipeline_cores: auto needs the model to count its weights")
        pipeline = default_pipeline_cores(model, _host_cores(options))
    if pipeline:
        args += ["--neuroncore-pipeline-cores", str(int(pipeline))]
    return args + list(options.get("compiler_args") or [])


def _host_cores(options: dict[str, Any]) -> int | None:
    if options.get("neuron_cores"):
        return int(options["neuron_cores"])
    try:
        return len(cores.discover_neuron_cores())
    except cores.NoFreeCoreGroup:
        return None


def pipeline_cores(args: list[str]) -> int:
    if "--neuroncore-pipeline-cores" in args:
        return int(args[args.index("--neuroncore-pipeline-cores") + 1])
    return 1


class NeuronTarget(NeuronTargetBase):
    name = "neuron"
    sdk = "torch_neuron"
    auto_precisions = ("bf16",)

    def compile(
        self, module: torch.nn.Module, example: tuple[torch.Tensor, ...], options: dict[str, Any]
    ) -> torch.nn.Module:
        import_sdk(self.sdk)  # importing torch_neuron adds torch.neuron
        workdir = options.get("compiler_workdir")
        return torch.neuron.trace(  # type: ignore[attr-defined]
            module.eval(),
            example,
            compiler_args=compiler_args(options, module),
            compiler_workdir=str(workdir) if workdir else None,
        )

    def describe(self, options: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
        args = compiler_args(options, model)
        precision = fast_math(options)[1]
        return {
            "precision": precision,
            "compiler_args": args,
            "inline_weights_to_neff": True,
            "cores_per_module": pipeline_cores(args),
            "weight_bytes": weight_bytes(model, precision),
        }
