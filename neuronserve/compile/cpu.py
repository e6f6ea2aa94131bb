"""CPU target: one module with dynamic shapes, in the precision the spec asks for.

- fp32: TorchScript trace + freeze (the faithful reference path), and the same model
  exported to ONNX Runtime with fused transformer operators (`fp32-onnx`, see ort.py):
  both are fp32, both are checked against eager at fp32's tolerance, and the faster one
  here is kept (MiniLM on an AVX2 host, model time per request 11.7 -> 5.5 ms at 8
  tokens, 54.9 -> 49.2 at 128: BENCHMARKS.md).
- bf16: the same trace with bfloat16 weights and activations: about 2x fp32 on a CPU with
  native AVX512-BF16, slower than fp32 on one without (auto measures which this is).
- int8: ONNX Runtime with fused transformer operators and dynamically quantised linear
  layers (see ort.py), faster than torch's own dynamic int8.
- OpenVINO builds of each precision (openvino.py): fp32, bf16 (the CPU plugin's bf16:
  MiniLM 2.1x / 1.3x TorchScript bf16 at 8 / 128 tokens, one thread,
  benchmarks/precision-variants-minilm-openvino.md) and static int8 calibrated by NNCF
  (DistilBERT: 23.0 ms over the grid against ONNX Runtime int8's 39.4, BENCHMARKS.md).
  Where OpenVINO cannot build one here (not installed; bf16 on a CPU without it) that
  candidate is refused with the reason, and the others are still tried.

The traced graph accepts any (batch, sequence); the bucket grid only bounds padding
so the module sees the shapes that were validated and warmed up. One file holds the
weights once, whatever the grid.
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from pathlib import Path
from typing import Any

import torch

from . import openvino
from .openvino import OvModule, export_openvino
from .ort import OrtModule, export_onnx

# what a spec may name
PRECISIONS = ("fp32", "bf16", "int8")
# each candidate build: the precision it runs, and what its file is (the library running it)
CANDIDATES = {
    "fp32": ("fp32", "torchscript"),
    "fp32-onnx": ("fp32", "onnx"),
    "bf16": ("bf16", "torchscript"),
    "int8": ("int8", "onnx"),
    "fp32-openvino": ("fp32", "openvino"),
    "bf16-openvino": ("bf16", "openvino"),
    "int8-openvino": ("int8", "openvino"),
}


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16, or AMX's tiles)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


# a built module of each library
Compiled = torch.nn.Module | OrtModule | OvModule
# the package (of the cpu extra) that runs each module format besides torch: what an image
# serving CPU artifacts installs
RUNTIME_PACKAGES = {"onnx": "onnxruntime", "openvino": "openvino"}


class CpuTarget:
    name = "cpu"
    dynamic_shapes = True
    file_suffix = ".pt"
    # what `precision: auto` tries; the driver times each that passes and keeps the fastest
    auto_precisions = (
        "int8",
        "int8-openvino",
        "bf16",
        "bf16-openvino",
        "fp32",
        "fp32-onnx",
        "fp32-openvino",
    )
    auto_times_candidates = True

    def variants(self, precision: str) -> tuple[str, ...]:
        """The builds a named precision may get, timed against each other like auto."""
        return tuple(c for c, (p, _) in CANDIDATES.items() if p == precision) or (precision,)

    def module_format_of(self, precision: str) -> str:
        """Which library's module the candidate build `precision` is."""
        return CANDIDATES[precision][1]

    def unavailable(self, precision: str, named: bool = False) -> str | None:
        """Why the candidate build `precision` cannot be made on this host, or (when auto
        chooses, `named` False) is not worth making: TorchScript bf16 on a CPU that only
        emulates it runs slower than fp32, so auto would build, check and time it for
        nothing. None: build it."""
        runs, module_format = CANDIDATES[precision]
        if module_format == "openvino":
            return openvino.unavailable(runs)
        if runs == "bf16" and not named and not native_bf16():
            return (
                "this CPU has no native bf16 (AVX512-BF16 or AMX), so torch would emulate it, "
                "slower than fp32 (--precision bf16 builds it anyway)"
            )
        return None

    def compile(
        self, module: torch.nn.Module, example: tuple[torch.Tensor, ...], options: dict[str, Any]
    ) -> Compiled:
        precision = options.get("precision") or "fp32"
        if precision not in CANDIDATES:
            raise ValueError(f"target cpu has no precision {precision!r}; choose {PRECISIONS}")
        runs, module_format = CANDIDATES[precision]
        if module_format == "openvino":
            return OvModule(export_openvino(module, example, runs, options))
        if module_format == "onnx":
            return OrtModule(
                export_onnx(
                    module,
                    example,
                    options["input_names"],
                    int8=precision == "int8",
                    per_token=bool(options.get("per_token")),
                )
            )
        if precision == "bf16":
            module = copy.deepcopy(module).to(torch.bfloat16)
        with torch.no_grad(), warnings.catch_warnings():
            # transformers' masking code warns that Python branches are frozen into the
            # trace; every bucket is validated against eager afterwards, which is the check
            # that matters.
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(module.eval(), example, check_trace=False)
            return torch.jit.freeze(traced)

    def save(self, compiled: Compiled, path: Path) -> None:
        if isinstance(compiled, OrtModule):
            path.write_bytes(compiled.model_bytes)
        elif isinstance(compiled, OvModule):
            path.write_bytes(compiled.file_bytes)
        else:
            torch.jit.save(compiled, str(path))

    def load(self, path: Path, core: int | None = None, data: bytes | None = None) -> Compiled:
        for library in (OrtModule, OvModule):
            if path.suffix == library.file_suffix:
                return library(data if data is not None else path.read_bytes())
        source = io.BytesIO(data) if data is not None else str(path)
        return torch.jit.load(source, map_location="cpu").eval()

    def versions(self) -> dict[str, str]:
        # from the installed distributions: importing either library to ask costs a
        # compile a large part of a second (imported here: a worker loading a module
        # needs none of the compile cache)
        from .cache import installed

        found = {"compiler": f"torch.jit {torch.__version__}"}
        for package in RUNTIME_PACKAGES.values():
            if (version := installed(package)) is not None:
                found[package] = version
        return found

    def describe(self, options: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
        precision = options.get("precision") or "fp32"
        if precision not in CANDIDATES:
            raise ValueError(
                f"target cpu has no precision {precision!r}; choose one of "
                f"{', '.join(PRECISIONS)} or auto"
            )
        runs, module_format = CANDIDATES[precision]
        return {"precision": runs, "cores_per_module": 1, "module_format": module_format}

    def cannot_run_here(self, options: dict[str, Any]) -> str | None:
        return None

    def compiling(self, options: dict[str, Any]) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def replicas(self, cores_per_worker: int, cores_per_module: int) -> int:
        return 1  # a multi-core worker runs one copy on all its cores' threads
