"""Build one precision's modules: a dynamic-shape target compiles once (on the largest
bucket's example), a static-shape target once per bucket on that bucket's example. What
was saved is loaded back for checking (reference.py), unless the target's modules cannot
run on this host, where the build stays on disk unchecked.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..artifact import DYNAMIC, module_file
from ..buckets import Bucket
from ..execution import Executor, Module
from .context import CompileContext
from .reference import Reference


@dataclass
class Build:
    """One precision's compiled modules in a candidate folder."""

    precision: str
    folder: Path
    # bucket key (or "dynamic") -> module file, as the manifest records it
    modules: dict[str, str] = field(default_factory=dict)
    loaded: dict[str, Module] = field(default_factory=dict)

    def module_for(self, bucket: Bucket) -> Module:
        return self.loaded[module_file(self.modules, bucket)]

    def executor(self, ctx: CompileContext) -> Executor:
        return ctx.executor(self.module_for)


def _save(ctx: CompileContext, build: Build, key: str, compiled: Any, load: bool) -> None:
    stem = "model" if key == DYNAMIC else key
    # an ONNX Runtime CPU module is .onnx, whatever the target's usual suffix
    name = stem + getattr(compiled, "file_suffix", ctx.target.file_suffix)
    build.modules[key] = name
    ctx.target.save(compiled, build.folder / name)
    if load:  # check what was saved, not what is in memory
        build.loaded[name] = ctx.target.load(build.folder / name)


def build_precision(
    ctx: CompileContext, precision: str, folder: Path, reference: Reference, load: bool = True
) -> Build:
    """Compile `precision` into `folder`, loading each module back when `load`."""
    build = Build(precision, folder)
    target = ctx.target
    if target.dynamic_shapes:
        largest = Bucket(ctx.grid.max_batch, ctx.grid.max_seq)
        compiled = target.compile(
            ctx.eager, reference.example(largest, ctx.layout), ctx.target_options(precision)
        )
        _save(ctx, build, DYNAMIC, compiled, load)
        return build
    bar = tqdm(
        ctx.grid.buckets,
        desc=f"compile {target.name} {precision}",
        unit="bucket",
        disable=not ctx.progress,
        file=sys.stderr,
    )
    for bucket in bar:
        bar.set_postfix_str(f"batch={bucket.batch} seq={bucket.seq}")
        compiled = target.compile(
            ctx.eager, reference.example(bucket, ctx.layout), ctx.target_options(precision, bucket)
        )
        _save(ctx, build, bucket.key, compiled, load)
    return build
