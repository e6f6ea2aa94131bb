"""neuronx target (Inf2, Trn1): torch_neuronx.trace, one module per bucket.

Compiler options from the spec become neuronx-cc arguments: --auto-cast,
--auto-cast-type, --optlevel, plus any extra arguments. Modules are traced with
inline_weights_to_neff=False so the NEFFs hold no weights: they stay TorchScript
tensors that torch_neuronx loads onto the device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .neuron_sdk import TorchScriptNeuronModule, import_sdk, sdk_version


def compiler_args(options: dict[str, Any]) -> list[str]:
    args: list[str] = []
    if options.get("auto_cast"):
        args += ["--auto-cast", options["auto_cast"]]
    if options.get("auto_cast_type"):
        args += ["--auto-cast-type", options["auto_cast_type"]]
    if options.get("optlevel"):
        args += ["--optlevel", str(options["optlevel"])]
    if options.get("compile_for"):
        # neuronx-cc compiles for the named platform without a Neuron device present
        args += ["--target", options["compile_for"]]
    if options.get("pipeline_cores"):
        raise ValueError(
            "pipeline_cores is an Inf1 (target neuron) option; on Inf2/Trn1 give "
            "each worker several cores with cores_per_worker instead"
        )
    return args + list(options.get("compiler_args") or [])


class NeuronxTarget(TorchScriptNeuronModule):
    name = "neuronx"
    sdk = "torch_neuronx"
    weights_file = "weights.safetensors"

    def save_weights(self, module: torch.nn.Module, path: Path) -> None:
        from safetensors.torch import save_file

        save_file(
            {k: v.detach().contiguous().clone() for k, v in module.state_dict().items()}, str(path)
        )

    def attach_weights(self, modules: list[torch.nn.Module], path: Path) -> None:
        """Give every bucket module the same host tensors, read once from `path`
        (torch_neuronx.replace_weights takes the original model's state_dict)."""
        from safetensors.torch import load_file

        neuronx = import_sdk(self.sdk)
        shared = load_file(str(path))
        for module in modules:
            neuronx.replace_weights(module, shared)

    def compile(
        self, module: torch.nn.Module, example: tuple[torch.Tensor, ...], options: dict[str, Any]
    ) -> torch.nn.Module:
        neuronx = import_sdk(self.sdk)
        workdir = options.get("compiler_workdir")
        extra = {}
        if options.get("compile_for"):
            # A build host has no Neuron device: trace through torch-neuronx's CPU backend
            # and let neuronx-cc compile for the named platform.
            extra["cpu_backend"] = True
        return neuronx.trace(
            module.eval(),
            example,
            compiler_args=compiler_args(options),
            compiler_workdir=str(workdir) if workdir else None,
            inline_weights_to_neff=False,
            **extra,
        )

    def versions(self) -> dict[str, str]:
        return {"compiler": f"torch_neuronx {sdk_version(import_sdk(self.sdk))}"}

    def describe(self, options: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
        return {
            "compiler_args": compiler_args(options),
            "inline_weights_to_neff": False,
            "cores_per_module": 1,
        }
