"""Tracing as the Neuron SDK does it, for the stand-ins of torch_neuronx and torch_neuron.

- torch-neuronx traces through XLA: it runs the module on the example inputs and records
  the operations, so torch.jit.is_tracing() is False and Python branches are decided by
  the example's values ("Fixed Control Flow ... will not re-evaluate the branch
  conditions upon inference", trace API page). Here: torch.jit.trace with
  torch.jit.is_tracing patched to answer False, so libraries take the branches they take
  in eager mode (transformers drops an all-ones attention mask, for one).
- The compiler casts: neuronx-cc `--auto-cast` none | matmult | all, `--auto-cast-type`
  bf16 | fp16 | tf32, defaulting to matmult and bf16 up to SDK 2.22 and to none in later
  releases (neuronx-cc CLI reference:
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/neuronx-cc/api-reference-guide/neuron-compiler-cli-reference-guide.html);
  neuron-cc (Inf1) `--fast-math` casts every FP32 operator to BF16 by default and runs
  matmults in BF16/FP16 even with `none` ("none is equivalent to using
  fp32-cast-matmult-bf16 no-fast-relayout", neuron-cc CLI reference:
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/compiler/neuron-cc/command-line-reference.html).
  Here: Linear layers compute in the cast type (matmult), or the whole module does (all);
  tf32 is not emulated (it computes in fp32).
"""

from __future__ import annotations

import contextlib
import copy

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class CastLinear(torch.nn.Module):
    """A Linear layer whose matmul runs in `dtype`, as the compiler's auto-cast does."""

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(linear.weight.detach().to(dtype), requires_grad=False)
        self.bias = (
            None
            if linear.bias is None
            else torch.nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)
        )
        self.dtype = dtype

    def forward(self, x):
        return torch.nn.functional.linear(x.to(self.dtype), self.weight, self.bias).to(x.dtype)


def cast(module: torch.nn.Module, mode: str, type_: str) -> torch.nn.Module:
    """A copy of `module` computing as the compiler's cast `mode` with `type_` would."""
    dtype = DTYPES.get(type_)
    if mode == "none" or dtype is None:
        return module
    module = copy.deepcopy(module)
    if mode == "all":
        return _AllCast(module.to(dtype))
    for sub in list(module.modules()):
        for child_name, child in list(sub.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(sub, child_name, CastLinear(child, dtype))
    return module


class _AllCast(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *inputs):
        return self.inner(*inputs).float()


@contextlib.contextmanager
def xla_like():
    """torch.jit.is_tracing() answers False while tracing, as under XLA tracing."""
    real = torch.jit.is_tracing
    torch.jit.is_tracing = lambda: False
    try:
        yield
    finally:
        torch.jit.is_tracing = real


def trace_graph(module: torch.nn.Module, example: tuple[torch.Tensor, ...]):
    import warnings

    with torch.no_grad(), xla_like(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(module.eval(), example, check_trace=False)


def option(args: list[str], flag: str, default: str) -> str:
    """The value of `flag` in compiler arguments; the right-most wins, as in neuronx-cc."""
    value = default
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
    return value
