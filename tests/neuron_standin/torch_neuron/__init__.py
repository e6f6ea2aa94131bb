"""Stand-in for torch_neuron (Inf1): importing it provides torch.neuron.trace."""

import sys

import torch
from _record import record, shapes

__version__ = "0.0.0+standin"
record("import", module="torch_neuron")


def trace(model, example_inputs, compiler_args=None, **kwargs):
    record(
        "trace",
        module="torch_neuron",
        compiler_args=compiler_args,
        shapes=shapes(example_inputs),
        extra=sorted(kwargs),
    )
    with torch.no_grad():
        return torch.jit.freeze(torch.jit.trace(model.eval(), example_inputs, check_trace=False))


torch.neuron = sys.modules[__name__]
