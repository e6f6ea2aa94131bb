"""Stand-in for torch_neuron (Inf1): importing it provides torch.neuron.trace, which
compiles with neuron-cc's casts (see _standin_trace: matmults always in BF16/FP16) and
returns a module loaded onto a NeuronCore (see _standin_runtime)."""

from __future__ import annotations

import sys

import torch
from _standin_runtime import compiled_module, record, shapes
from _standin_trace import cast, option, trace_graph

from . import experimental

__version__ = "1.13.1.2.10.12.0+standin"
record("import", module="torch_neuron")

# --fast-math value -> (which operators, cast type). "all" is the default; `none` still
# runs matmults in BF16 (neuron-cc CLI reference).
FAST_MATH = {
    "none": ("matmult", "bf16"),
    "fp32-cast-matmult": ("matmult", "bf16"),
    "fp32-cast-matmult-bf16": ("matmult", "bf16"),
    "fp32-cast-matmult-fp16": ("matmult", "fp16"),
    "fp32-cast-all": ("all", "bf16"),
    "fp32-cast-all-fp16": ("all", "fp16"),
    "all": ("all", "bf16"),
}


def trace(model, example_inputs, compiler_args=None, compiler_workdir=None, **kwargs):
    args = list(compiler_args or [])
    mode, type_ = FAST_MATH[option(args, "--fast-math", "all").split()[0]]
    record(
        "trace",
        module="torch_neuron",
        compiler_args=compiler_args,
        compiler_workdir=str(compiler_workdir) if compiler_workdir else None,
        shapes=shapes(example_inputs),
        extra=sorted(kwargs),
        auto_cast=mode,
        auto_cast_type=type_,
    )
    example = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    # neuron-cc compiles on any host; the model is loaded onto a NeuronCore at
    # torch.jit.load on an Inf1 instance
    return compiled_module(
        trace_graph(cast(model, mode, type_), example), f"trace-{shapes(example)}", 0
    )


torch.neuron = sys.modules[__name__]

__all__ = ["experimental", "trace"]
