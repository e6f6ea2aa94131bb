"""neuron target (Inf1): torch.neuron.trace from torch_neuron, one module per bucket.

neuron-cc has no auto-cast flag of that name: auto-cast maps to --fast-math
(fp32-cast-matmult / fp32-cast-all, with an -fp16 suffix for fp16). Pipeline mode
spreads one model over several NeuronCores (--neuroncore-pipeline-cores); a worker
then needs that many cores (cores_per_worker) and NEURONCORE_GROUP_SIZES to match.
Inf1 NEFFs hold their weights, so every bucket module carries its own copy: the
manifest reports the artifact size.
"""

from __future__ import annotations

from typing import Any

import torch

from .neuron_sdk import TorchScriptNeuronModule, import_sdk, sdk_version


def default_pipeline_cores(model: torch.nn.Module) -> int:
    """The seed's rule of thumb: 4 * round(weights / 2e7), at least 1."""
    weights = sum(p.numel() for p in model.parameters())
    return max(1, 4 * round(weights / 2e7))


def compiler_args(options: dict[str, Any], model: torch.nn.Module | None = None) -> list[str]:
    args: list[str] = []
    cast, cast_type = options.get("auto_cast"), options.get("auto_cast_type")
    if cast_type == "tf32":
        raise ValueError("auto_cast_type tf32 is not available on Inf1: use bf16 or fp16")
    if options.get("optlevel"):
        raise ValueError("optlevel is a neuronx-cc (Inf2/Trn1) option; neuron-cc has none")
    if options.get("compile_for"):
        raise ValueError(
            "compile_for names an Inf2/Trn platform; neuron-cc (Inf1) compiles "
            "on any host without it"
        )
    if cast:
        mode = {"none": "none", "matmult": "fp32-cast-matmult", "all": "fp32-cast-all"}[cast]
        if cast != "none" and cast_type == "fp16":
            mode += "-fp16"
        args += ["--fast-math", mode]
    pipeline = options.get("pipeline_cores")
    if pipeline == "auto":
        if model is None:
            raise ValueError("pipeline_cores: auto needs the model to count its weights")
        pipeline = default_pipeline_cores(model)
    if pipeline:
        args += ["--neuroncore-pipeline-cores", str(int(pipeline))]
    return args + list(options.get("compiler_args") or [])


def pipeline_cores(args: list[str]) -> int:
    if "--neuroncore-pipeline-cores" in args:
        return int(args[args.index("--neuroncore-pipeline-cores") + 1])
    return 1


class NeuronTarget(TorchScriptNeuronModule):
    name = "neuron"
    sdk = "torch_neuron"

    def compile(
        self, module: torch.nn.Module, example: tuple[torch.Tensor, ...], options: dict[str, Any]
    ) -> torch.nn.Module:
        import_sdk(self.sdk)  # importing torch_neuron adds torch.neuron
        return torch.neuron.trace(  # type: ignore[attr-defined]
            module.eval(), example, compiler_args=compiler_args(options, module)
        )

    def versions(self) -> dict[str, str]:
        return {"compiler": f"torch_neuron {sdk_version(import_sdk(self.sdk))}"}

    def describe(self, options: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
        args = compiler_args(options, model)
        return {
            "compiler_args": args,
            "inline_weights_to_neff": True,
            "cores_per_module": pipeline_cores(args),
        }
