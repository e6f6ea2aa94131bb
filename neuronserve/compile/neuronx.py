"""neuronx target (Inf2, Trn1): torch_neuronx.trace, one module per bucket.

The precision is what neuronx-cc runs, made explicit: fp32 passes `--auto-cast none`,
bf16 and fp16 `--auto-cast matmult --auto-cast-type bf16|fp16`. Without these flags the
compiler's own default decides, and that changed between releases (matmult and bf16 up to
SDK 2.22, none later: "--auto-cast ... (Default: matmult)" in the neuronx-cc CLI reference
of those releases,
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/neuronx-cc/api-reference-guide/neuron-compiler-cli-reference-guide.html).
`auto_cast` / `auto_cast_type` given in the spec win, and the precision follows them.
`--model-type transformer` ("perform optimizations specific to Transformer models") is
added for these encoders unless the spec's compiler_args name a model type.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .base import CompileError
from .neuron_sdk import NeuronTargetBase, import_sdk, sdk_version, weight_bytes

PRECISIONS = ("fp32", "bf16", "fp16")


def cast_args(options: dict[str, Any]) -> tuple[list[str], str]:
    """(the --auto-cast arguments, the precision the compiler then runs)."""
    cast, cast_type = options.get("auto_cast"), options.get("auto_cast_type")
    precision = options.get("precision") or "auto"
    if cast is not None:
        effective = "fp32" if cast == "none" else (cast_type or "bf16")
        if precision not in ("auto", effective):
            raise ValueError(
                f"auto_cast {cast} with auto_cast_type {cast_type or 'bf16'} runs {effective}, "
                f"not precision {precision}: leave one of them unset"
            )
        args = ["--auto-cast", cast] + (["--auto-cast-type", cast_type] if cast_type else [])
        return args, effective
    if precision == "auto":
        precision = "bf16"
    if precision not in PRECISIONS:
        raise ValueError(
            f"target neuronx has no precision {precision!r}; choose fp32, bf16, fp16 or auto"
        )
    if precision == "fp32":
        return ["--auto-cast", "none"], "fp32"
    return ["--auto-cast", "matmult", "--auto-cast-type", precision], precision


def _refuse_cast_flags(options: dict[str, Any]) -> None:
    given = [
        a
        for a in options.get("compiler_args") or []
        if a in ("--auto-cast", "--auto-cast-type", "--fast-math")
    ]
    if given:
        raise ValueError(
            f"{', '.join(given)} in compiler_args would change the precision "
            "behind the manifest's back: set precision (or auto_cast and "
            "auto_cast_type) instead"
        )


def compiler_args(options: dict[str, Any]) -> list[str]:
    if options.get("pipeline_cores"):
        raise ValueError(
            "pipeline_cores is an Inf1 (target neuron) option; on Inf2/Trn1 give "
            "each worker several cores with cores_per_worker instead"
        )
    args, _ = cast_args(options)
    _refuse_cast_flags(options)
    if options.get("optlevel"):
        args += ["--optlevel", str(options["optlevel"])]
    if options.get("compile_for"):
        # neuronx-cc compiles for the named platform without a Neuron device present
        args += ["--target", options["compile_for"]]
    extra = list(options.get("compiler_args") or [])
    if "--model-type" not in extra:
        args += ["--model-type", "transformer"]
    return args + extra


class NeuronxTarget(NeuronTargetBase):
    name = "neuronx"
    sdk = "torch_neuronx"
    auto_precisions = ("bf16", "fp32")

    def compile(
        self, module: torch.nn.Module, example: tuple[torch.Tensor, ...], options: dict[str, Any]
    ) -> torch.nn.Module:
        neuronx = import_sdk(self.sdk)
        workdir = options.get("compiler_workdir")
        extra = {}
        if options.get("compile_for"):
            # A build host has no Neuron device: trace through torch-neuronx's CPU backend
            # ("cpu_backend ... needs to be used with the compiler_args option to set the
            # --target flag"), which SDK releases before 2.21 do not have.
            if "cpu_backend" not in inspect.signature(neuronx.trace).parameters:
                raise CompileError(
                    f"compile_for needs torch-neuronx from Neuron SDK 2.21 or later (this "
                    f"torch-neuronx {sdk_version(neuronx)} has no trace(cpu_backend=...)): "
                    "upgrade the SDK, or compile on an Inf2/Trn1 instance without "
                    "--compile-for"
                )
            extra["cpu_backend"] = True
        return neuronx.trace(
            module.eval(),
            example,
            compiler_args=compiler_args(options),
            compiler_workdir=str(workdir) if workdir else None,
            **extra,
        )

    def describe(self, options: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
        args = compiler_args(options)
        precision = cast_args(options)[1]
        return {
            "precision": precision,
            "compiler_args": args,
            "inline_weights_to_neff": True,
            "cores_per_module": 1,
            "weight_bytes": weight_bytes(model, precision),
        }


__all__ = ["NeuronxTarget", "cast_args", "compiler_args"]
