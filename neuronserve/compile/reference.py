"""What compiled modules are checked against: the fp32 eager model's outputs on real,
padded text, computed where the model is (the compile host) and kept in the artifact
(reference.npz), so the same check runs at compile time or later on the serving host
(`neuronserve validate`, for targets whose modules only run there).

Every bucket is checked on a batch holding at least one padded row: a trace whose example
fills its bucket can bake in an "attention mask is all ones" branch (XLA tracing decides
Python branches on the example's values), which only a padded row shows. Batch-1 buckets
are also checked on a row that fills them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..artifact import BucketValidation
from ..buckets import Bucket, BucketGrid, pad_batch
from ..execution import Executor, InputLayout, Module, Row, RowOutputs
from ..tasks import Task
from .base import CompileError

if TYPE_CHECKING:
    from .context import CompileContext

REFERENCE_FILE = "reference.npz"


def tensors(arrays: dict[str, np.ndarray], layout: InputLayout) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(arrays[n]) for n in layout.names)


@dataclass
class Reference:
    # bucket key -> the padded input arrays of each checked batch, and eager's outputs
    inputs: dict[str, list[dict[str, np.ndarray]]]
    outputs: dict[str, list[np.ndarray]]
    # the accuracy texts' token rows (up to the largest sequence) and eager's outputs
    # (one array per row for a per-token task)
    accuracy_rows: list[Row]
    accuracy_outputs: RowOutputs

    @property
    def output_dim(self) -> int:
        return int(self.accuracy_outputs[0].shape[-1])

    @classmethod
    def compute(cls, ctx: CompileContext) -> Reference:
        eager = ctx.eager_executor()
        inputs: dict[str, list[dict[str, np.ndarray]]] = {}
        outputs: dict[str, list[np.ndarray]] = {}
        for bucket in ctx.grid.buckets:
            sets = [
                pad_batch(rows, bucket, ctx.layout.names, ctx.layout.pad_values)
                for rows in ctx.examples.bucket_sets(bucket)
            ]
            inputs[bucket.key] = sets
            with torch.no_grad():
                outputs[bucket.key] = [
                    ctx.eager(*tensors(a, ctx.layout)).float().numpy() for a in sets
                ]
        rows = ctx.examples.accuracy_rows(ctx.grid.max_seq)
        return cls(inputs, outputs, rows, eager.run(rows))

    def example(self, bucket: Bucket, layout: InputLayout) -> tuple[torch.Tensor, ...]:
        return tensors(self.inputs[bucket.key][0], layout)

    def save(self, path: Path) -> None:
        out = self.accuracy_outputs
        arrays: dict[str, np.ndarray] = (
            {
                "accuracy/output_per_token": np.concatenate(out),
                # a text's rows: its tokens, and the rows a module puts before them
                "accuracy/output_lengths": np.array([len(o) for o in out]),
            }
            if isinstance(out, list)
            else {"accuracy/output": out}
        )
        for key, sets in self.inputs.items():
            for i, (a, out) in enumerate(zip(sets, self.outputs[key], strict=True)):
                arrays[f"bucket/{key}/{i}/output"] = out
                arrays.update({f"bucket/{key}/{i}/input/{n}": v for n, v in a.items()})
        rows = self.accuracy_rows
        for name in rows[0] if rows else []:
            if isinstance(rows[0][name], np.ndarray) and np.ndim(rows[0][name]) > 1:
                arrays[f"accuracy/images/{name}"] = np.stack([r[name] for r in rows])
            else:
                arrays[f"accuracy/rows/{name}"] = np.concatenate(
                    [np.asarray(r[name], dtype=np.int64) for r in rows]
                )
        arrays["accuracy/lengths"] = np.array(
            [len(r["input_ids"]) if "input_ids" in r else 1 for r in rows]
        )
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: Path) -> Reference:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        inputs: dict[str, list[dict[str, np.ndarray]]] = {}
        outputs: dict[str, list[np.ndarray]] = {}
        for k in sorted(arrays):
            parts = k.split("/")
            if parts[0] != "bucket":
                continue
            key, i = parts[1], int(parts[2])
            sets = inputs.setdefault(key, [])
            while len(sets) <= i:
                sets.append({})
            if parts[3] == "input":
                sets[i][parts[4]] = arrays[k]
            else:
                outs = outputs.setdefault(key, [])
                while len(outs) <= i:
                    outs.append(np.empty(0))
                outs[i] = arrays[k]
        lengths = arrays["accuracy/lengths"]
        ends = np.cumsum(lengths)
        names = [k.split("/")[-1] for k in arrays if k.startswith("accuracy/rows/")]
        images = [k.split("/")[-1] for k in arrays if k.startswith("accuracy/images/")]
        rows: list[Row] = (
            [{n: arrays[f"accuracy/images/{n}"][i] for n in images} for i in range(len(lengths))]
            if images
            else [
                {n: arrays[f"accuracy/rows/{n}"][e - n_ : e].tolist() for n in names}
                for e, n_ in zip(ends, lengths, strict=True)
            ]
        )
        if "accuracy/output_per_token" in arrays:
            per_token = arrays["accuracy/output_per_token"]
            counts = arrays.get("accuracy/output_lengths", lengths)
            out_ends = np.cumsum(counts)
            return cls(
                inputs,
                outputs,
                rows,
                [per_token[e - n : e] for e, n in zip(out_ends, counts, strict=True)],
            )
        return cls(inputs, outputs, rows, arrays["accuracy/output"])


@dataclass
class Judge:
    """What a compiled precision is held to: fp32 to `tolerance` per bucket (the trace
    must be faithful); lower precisions to the task's accuracy floor over many texts."""

    task: Task
    precision: str
    tolerance: float
    floor_field: str | None
    floor: float | None


@dataclass
class Verdict:
    validation: list[BucketValidation]
    accuracy: dict[str, Any]
    # why the precision is refused (under the accuracy floor), or None
    refused: str | None = None


def check(
    module_for: Callable[[Bucket], Module],
    reference: Reference,
    judge: Judge,
    grid: BucketGrid,
    layout: InputLayout,
) -> Verdict:
    """Every bucket's module against the reference (raises CompileError when a trace is
    unfaithful), then accuracy over the accuracy texts through the serving path."""
    validation = [check_bucket(module_for(b), b, reference, judge, layout) for b in grid.buckets]
    got = Executor(module_for, grid, layout).run(reference.accuracy_rows)
    task = judge.task
    accuracy = {
        **task.accuracy(got, reference.accuracy_outputs),
        "texts": len(reference.accuracy_rows),
    }
    value = accuracy.get(task.accuracy_metric, np.nan)
    refused = None
    if judge.precision != "fp32" and judge.floor is not None and value < judge.floor:
        refused = (
            f"{task.accuracy_metric} {value:.4f} against fp32 eager is under "
            f"{judge.floor_field} {judge.floor:g}"
        )
    return Verdict(validation, accuracy, refused)


def check_bucket(
    module: Module, bucket: Bucket, reference: Reference, judge: Judge, layout: InputLayout
) -> BucketValidation:
    diff = 0.0
    for arrays, want in zip(
        reference.inputs[bucket.key], reference.outputs[bucket.key], strict=True
    ):
        with torch.no_grad():
            got = module(*tensors(arrays, layout)).float().numpy()
        if got.shape != want.shape:
            raise CompileError(
                f"bucket {bucket.key}: compiled output shape {got.shape} "
                f"differs from eager {want.shape}"
            )
        if layout.per_token:  # the padding tokens' outputs are dropped when serving
            mask = arrays["attention_mask"].astype(bool)
            lead = np.ones((mask.shape[0], layout.leading), dtype=bool)
            real = np.concatenate((lead, mask), axis=1)
            got, want = got[real], want[real]
        got, want = judge.task.compared(got), judge.task.compared(want)
        d = float(np.max(np.abs(got - want)))
        if not np.all(np.isfinite(got)) or math.isnan(d):
            raise CompileError(f"bucket {bucket.key}: the compiled module produced NaN or inf")
        diff = max(diff, d)
    if judge.precision == "fp32" and diff > judge.tolerance:
        raise CompileError(
            f"bucket {bucket.key}: compiled output differs from the eager model by {diff:.3g} "
            f"(tolerance {judge.tolerance:g}); the compiled graph is not faithful. Raise "
            "`tolerance` only if that difference is acceptable for your use."
        )
    return BucketValidation(batch=bucket.batch, seq=bucket.seq, max_abs_diff=diff)
