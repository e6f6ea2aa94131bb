"""Stand-in for torch_neuronx (Inf2/Trn1): the parts neuronserve calls."""

import torch
from _record import record, shapes

__version__ = "0.0.0+standin"
record("import", module="torch_neuronx")


def trace(
    func,
    example_inputs,
    *_,
    compiler_workdir=None,
    compiler_args=None,
    inline_weights_to_neff=True,
    **kwargs,
):
    record(
        "trace",
        module="torch_neuronx",
        compiler_args=compiler_args,
        compiler_workdir=str(compiler_workdir) if compiler_workdir else None,
        inline_weights_to_neff=inline_weights_to_neff,
        shapes=shapes(example_inputs),
        extra=sorted(kwargs),
    )
    with torch.no_grad():
        return torch.jit.freeze(torch.jit.trace(func.eval(), example_inputs, check_trace=False))


def replace_weights(neuron_model, weights):
    # The stand-in's modules keep the weights they were traced with; what is checked is
    # that every bucket module is handed the same tensors.
    first = next(iter(weights.values()))
    record(
        "replace_weights",
        module="torch_neuronx",
        tensors=len(weights),
        first_tensor_ptr=first.data_ptr(),
        model=id(neuron_model),
    )
