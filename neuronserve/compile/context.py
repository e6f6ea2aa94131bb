"""What one compile works with, handed to the build, validation and precision steps
as one object instead of a dozen arguments."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..buckets import Bucket, BucketGrid, pad_batch
from ..execution import Executor, InputLayout, Module
from ..tasks import Task
from .base import Target
from .examples import Examples
from .job import CompileJob


@dataclass
class CompileContext:
    job: CompileJob
    target: Target
    task: Task
    # the task's module around the Hugging Face model, fp32 eager: the reference
    eager: torch.nn.Module
    # the inputs it is checked and timed on (text or images)
    examples: Examples
    grid: BucketGrid
    layout: InputLayout
    # the compile section's compiler options (CompileSection.compiler_options)
    options: dict[str, Any]
    progress: bool = True

    def executor(self, module_for: Any) -> Executor:
        """The serving path over this compile's grid, with `module_for(bucket)` modules."""
        return Executor(module_for, self.grid, self.layout)

    def eager_executor(self) -> Executor:
        eager: Module = self.eager
        return self.executor(lambda _bucket: eager)

    def calibration(self) -> list[tuple[torch.Tensor, ...]]:
        """The calibration rows one at a time, each padded into the smallest bucket that
        holds it, as the server would run it: what static int8 measures ranges on."""
        out = []
        for row in self.examples.calibration_rows(self.grid.max_seq):
            bucket = self.grid.choose(1, self.layout.length(row))
            arrays = pad_batch([row], bucket, self.layout.names, self.layout.pad_values)
            out.append(tuple(torch.from_numpy(arrays[n]) for n in self.layout.names))
        return out

    def target_options(self, precision: str, bucket: Bucket | None = None) -> dict[str, Any]:
        """Options for one `target.compile` call: the precision, the input names, a
        compiler workdir of the bucket's own when one was asked for, and how to get
        calibration inputs (a callable: only static quantisation asks)."""
        workdir = self.options.get("compiler_workdir")
        if workdir and bucket is not None:
            workdir = Path(workdir) / bucket.key
        return {
            **self.options,
            "precision": precision,
            "input_names": list(self.layout.names),
            "per_token": self.layout.per_token,
            "compiler_workdir": workdir,
            "calibration": self.calibration,
        }

    def say(self, message: str) -> None:
        if self.progress:
            print(message, file=sys.stderr)
