"""Stand-in for torch_neuronx (Inf2/Trn1): the documented API neuronserve calls, behaving
as the AWS Neuron documentation says (see _standin_runtime and _standin_trace for the
pages relied on). Its version follows NEURON_STANDIN_SDK."""

from __future__ import annotations

import os
import warnings

import torch
from _standin_runtime import NeuronModel, compiled_module, record, sdk_version, shapes
from _standin_trace import cast, option, trace_graph

from . import experimental

__version__ = "2.1.2." + ".".join(os.environ.get("NEURON_STANDIN_SDK", "2.21.0").split("."))
record("import", module="torch_neuronx")

# neuronx-cc's default auto-cast: matmult (bf16) up to SDK 2.22, none from 2.27 on
DEFAULT_AUTO_CAST = "matmult" if sdk_version() < (2, 27) else "none"


def _trace(
    func,
    example_inputs,
    compiler_args,
    compiler_workdir,
    inline_weights_to_neff,
    cpu_backend,
    extra,
):
    args = list(compiler_args or [])
    if isinstance(compiler_args, str):
        args = compiler_args.split()
    mode = option(args, "--auto-cast", DEFAULT_AUTO_CAST)
    type_ = option(args, "--auto-cast-type", "bf16")
    record(
        "trace",
        module="torch_neuronx",
        compiler_args=compiler_args,
        compiler_workdir=str(compiler_workdir) if compiler_workdir else None,
        inline_weights_to_neff=inline_weights_to_neff,
        shapes=shapes(example_inputs),
        extra=sorted(extra) + (["cpu_backend"] if cpu_backend else []),
        auto_cast=mode,
        auto_cast_type=type_,
    )
    example = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    graph = trace_graph(cast(func, mode, type_), example)
    host_bytes = (
        0
        if inline_weights_to_neff
        else sum(p.numel() * p.element_size() for p in func.parameters())
    )
    with torch.no_grad():
        answer = graph(*example)
    outputs = len(answer) if isinstance(answer, (tuple, list)) else 1
    module = compiled_module(graph, f"trace-{shapes(example)}", host_bytes, outputs)
    if not cpu_backend:
        # "When the underlying neuron::Model is initialized after tracing ... it is loaded
        # to a Neuron device": a trace without cpu_backend needs one
        module.handle = torch.ops.neuron_standin.load(module.blob, module.name)
    return module


if sdk_version() >= (2, 21):

    def trace(
        func,
        example_inputs,
        *_,
        input_output_aliases=None,
        compiler_workdir=None,
        compiler_args=None,
        partitioner_config=None,
        inline_weights_to_neff=True,
        cpu_backend=False,
        **kwargs,
    ):
        return _trace(
            func,
            example_inputs,
            compiler_args,
            compiler_workdir,
            inline_weights_to_neff,
            cpu_backend,
            kwargs,
        )
else:

    def trace(
        func,
        example_inputs,
        *_,
        input_output_aliases=None,
        compiler_workdir=None,
        compiler_args=None,
        partitioner_config=None,
        inline_weights_to_neff=True,
        **kwargs,
    ):
        # releases before 2.21 have no cpu_backend: unknown keywords are warned about and
        # ignored
        if kwargs:
            warnings.warn(f"Unexpected keyword arguments: {sorted(kwargs)}", stacklevel=2)
        return _trace(
            func, example_inputs, compiler_args, compiler_workdir, inline_weights_to_neff, False, {}
        )


def replace_weights(neuron_model, weights):
    """Records the call (the compiled graph keeps the weights it was traced with)."""
    if not neuron_model.host_weight_bytes:
        warnings.warn("the Neuron model does not contain separated weights", stacklevel=2)
    first = next(iter(weights.values()))
    record(
        "replace_weights",
        module="torch_neuronx",
        tensors=len(weights),
        first_tensor_ptr=first.data_ptr(),
        model=id(neuron_model),
    )


def move_trace_to_device(trace, device_id):
    """Moves the weights of a weight-separated model to the NeuronCore."""
    record("move_trace_to_device", handle=trace.handle, device_id=device_id)
    trace.host_weight_bytes = 0


__all__ = ["NeuronModel", "experimental", "move_trace_to_device", "replace_weights", "trace"]
