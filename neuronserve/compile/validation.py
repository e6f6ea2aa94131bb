"""Build one precision's modules and validate every bucket against the eager model.

A dynamic-shape target compiles once and its module is validated at every bucket; a
static-shape target compiles, saves, reloads and validates one module per bucket.
Validation runs real tokenized text, padded by the serving path's own code, through
what was saved, not what is in memory.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ..artifact import DYNAMIC, BucketValidation, module_file
from ..buckets import Bucket, pad_batch
from ..execution import Executor, Module, Row
from ..tokenization import TextTokenizer
from .base import CompileError
from .context import CompileContext
from .texts import VALIDATION_TEXTS


@dataclass
class Build:
    """One precision's compiled modules in a candidate folder, and how each bucket
    compared with eager."""

    precision: str
    folder: Path
    # bucket key (or "dynamic") -> module file, as the manifest records it
    modules: dict[str, str] = field(default_factory=dict)
    loaded: dict[str, Module] = field(default_factory=dict)
    validation: list[BucketValidation] = field(default_factory=list)
    # the size of one row of output (embedding size, number of labels)
    output_dim: int = 0

    def module_for(self, bucket: Bucket) -> Module:
        return self.loaded[module_file(self.modules, bucket)]

    def executor(self, ctx: CompileContext) -> Executor:
        return ctx.executor(self.module_for)


def validation_batch(tokenizer: TextTokenizer, bucket: Bucket) -> list[Row]:
    """`bucket.batch` rows of real text, the first filling the bucket, the others
    shorter, so masking and padding are both exercised."""
    step = max(1, bucket.seq // (2 * bucket.batch))
    rows: list[Row] = []
    for j in range(bucket.batch):
        length = max(3, bucket.seq - j * step)
        rows.append(
            tokenizer.encode_to_length(VALIDATION_TEXTS[j % len(VALIDATION_TEXTS)], length).row()
        )
    return rows


def _inputs(ctx: CompileContext, bucket: Bucket) -> tuple[torch.Tensor, ...]:
    rows = validation_batch(ctx.tokenizer, bucket)
    arrays = pad_batch(rows, bucket, ctx.layout.names, ctx.layout.pad_values)
    return tuple(torch.from_numpy(arrays[n]) for n in ctx.layout.names)


def _save_and_reload(ctx: CompileContext, build: Build, key: str, compiled: Any) -> Module:
    stem = "model" if key == DYNAMIC else key
    # an int8 CPU module is ONNX, whatever the target's usual suffix
    name = stem + getattr(compiled, "file_suffix", ctx.target.file_suffix)
    build.modules[key] = name
    ctx.target.save(compiled, build.folder / name)
    build.loaded[name] = ctx.target.load(build.folder / name)
    return build.loaded[name]


def build_precision(ctx: CompileContext, precision: str, folder: Path) -> Build:
    """Compile `precision` into `folder` and validate every bucket against eager."""
    build = Build(precision, folder)
    target = ctx.target
    if target.dynamic_shapes:
        largest = Bucket(ctx.grid.max_batch, ctx.grid.max_seq)
        compiled = target.compile(ctx.eager, _inputs(ctx, largest), ctx.target_options(precision))
        module = _save_and_reload(ctx, build, DYNAMIC, compiled)
    bar = tqdm(
        ctx.grid.buckets,
        desc=f"compile {target.name} {precision}",
        unit="bucket",
        disable=not ctx.progress,
        file=sys.stderr,
    )
    for bucket in bar:
        bar.set_postfix_str(f"batch={bucket.batch} seq={bucket.seq}")
        inputs = _inputs(ctx, bucket)
        if not target.dynamic_shapes:
            compiled = target.compile(ctx.eager, inputs, ctx.target_options(precision, bucket))
            module = _save_and_reload(ctx, build, bucket.key, compiled)
        validation, build.output_dim = check_bucket(ctx, precision, bucket, module, inputs)
        build.validation.append(validation)
    return build


def check_bucket(
    ctx: CompileContext,
    precision: str,
    bucket: Bucket,
    module: Module,
    inputs: tuple[torch.Tensor, ...],
) -> tuple[BucketValidation, int]:
    """Compare one bucket's compiled output with eager (its validation record and the
    output row size): shapes, finiteness, and for fp32
    the spec's `tolerance` (lower precisions are judged by the task's accuracy floor
    over many texts instead, see precision.py)."""
    with torch.no_grad():
        want = ctx.eager(*inputs).float().numpy()
        got = module(*inputs).float().numpy()
    if got.shape != want.shape:
        raise CompileError(
            f"bucket {bucket.key}: compiled output shape {got.shape} "
            f"differs from eager {want.shape}"
        )
    diff = float(np.max(np.abs(got - want)))
    if not np.all(np.isfinite(got)) or math.isnan(diff):
        raise CompileError(f"bucket {bucket.key}: the compiled module produced NaN or inf")
    if precision == "fp32" and diff > ctx.spec.tolerance:
        raise CompileError(
            f"bucket {bucket.key}: compiled output differs from the eager model by {diff:.3g} "
            f"(tolerance {ctx.spec.tolerance:g}); the compiled graph is not faithful. Raise "
            "`tolerance` only if that difference is acceptable for your use."
        )
    return (
        BucketValidation(batch=bucket.batch, seq=bucket.seq, max_abs_diff=diff),
        int(got.shape[-1]),
    )
