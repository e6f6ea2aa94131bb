"""Which precision an artifact gets: every candidate is built, validated per bucket,
and measured against fp32 eager on many texts through the serving path; one under the
task's accuracy floor is refused; with several candidates (`precision: auto`) the
fastest that passes, by batch-1 model time over the grid, is kept."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..artifact import PrecisionTrial
from ..buckets import BucketGrid
from ..execution import Executor, Row
from ..spec import DeploySpec
from ..tokenization import TextTokenizer
from .base import CompileError, Target
from .context import CompileContext
from .texts import VALIDATION_TEXTS, accuracy_texts
from .validation import Build, build_precision


def candidates(spec: DeploySpec, target: Target) -> tuple[tuple[str, ...], bool]:
    """(precisions to try, whether the user named one)."""
    if spec.precision != "auto":
        return (spec.precision,), True
    return tuple(getattr(target, "auto_precisions", ("fp32",))), False


def accuracy_rows(tokenizer: TextTokenizer, max_seq: int) -> list[Row]:
    return [
        e.row() for e in tokenizer.encode(accuracy_texts(), truncate=True) if len(e.ids) <= max_seq
    ]


def batch1_ms(executor: Executor, tokenizer: TextTokenizer, grid: BucketGrid) -> float:
    """Sum over the grid's sequence lengths of the best of three batch-1 runs: what
    `precision: auto` ranks candidates by. Two warm-up calls per shape first (TorchScript
    specialises on the second)."""
    total = 0.0
    for seq in grid.sequence_lengths:
        rows = [tokenizer.encode_to_length(VALIDATION_TEXTS[0], seq).row()]
        times = []
        for i in range(5):
            t0 = time.perf_counter()
            executor.run(rows)
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
        total += min(times)
    return total


@dataclass
class Candidate:
    build: Build
    # what the target reports about this compile for the manifest (compiler args, ...)
    described: dict
    trial: PrecisionTrial


@dataclass
class Choice:
    kept: Candidate
    trials: list[PrecisionTrial] = field(default_factory=list)


class PrecisionSearch:
    def __init__(self, ctx: CompileContext, folder: Path):
        self.ctx, self.folder = ctx, folder
        self.precisions, self.named = candidates(ctx.spec, ctx.target)
        self.rows = accuracy_rows(ctx.tokenizer, ctx.grid.max_seq)
        task = ctx.task
        self.floor_field = task.accuracy_floor_field
        self.floor = getattr(ctx.spec, self.floor_field) if self.floor_field else None
        # fp32 eager on the accuracy texts, through the same path, computed once
        self.reference = ctx.eager_executor().run(self.rows)

    def run(self) -> Choice:
        trials, kept = [], {}
        for precision in self.precisions:
            trial, candidate = self.try_precision(precision)
            trials.append(trial)
            if candidate is not None:
                kept[precision] = candidate
        if not kept:
            raise CompileError(
                "no precision met the accuracy floor: "
                + "; ".join(f"{t.precision}: {t.reason}" for t in trials)
            )
        best = min(kept.values(), key=lambda c: c.trial.batch1_ms or 0.0)
        return Choice(best, trials)

    def try_precision(self, precision: str) -> tuple[PrecisionTrial, Candidate | None]:
        ctx, task = self.ctx, self.ctx.task
        try:
            described = ctx.target.describe({**ctx.options, "precision": precision}, ctx.eager)
        except ValueError as e:
            raise CompileError(str(e)) from None
        folder = self.folder / precision
        folder.mkdir(parents=True)
        build = build_precision(ctx, precision, folder)
        got = build.executor(ctx).run(self.rows)
        accuracy = {**task.accuracy(got, self.reference), "texts": len(self.rows)}
        trial = PrecisionTrial(
            precision=precision,
            module_format=described.get("module_format"),
            accuracy=accuracy,
            passed=True,
        )
        value = accuracy.get(task.accuracy_metric, np.nan)
        if precision != "fp32" and self.floor is not None and value < self.floor:
            trial.passed = False
            trial.reason = (
                f"{task.accuracy_metric} {value:.4f} against fp32 eager is under "
                f"{self.floor_field} {self.floor:g}"
            )
            shutil.rmtree(folder)
            if self.named:
                raise CompileError(
                    f"precision {precision} refused: {trial.reason} on {len(self.rows)} texts. "
                    f"Use a higher precision, or lower `{self.floor_field}` explicitly if that "
                    "accuracy is acceptable for your use."
                )
            ctx.say(f"precision {precision}: refused, {trial.reason}")
            return trial, None
        if len(self.precisions) > 1:
            trial.batch1_ms = batch1_ms(build.executor(ctx), ctx.tokenizer, ctx.grid)
            ctx.say(
                f"precision {precision}: {task.accuracy_metric} {value:.5f}, batch-1 "
                f"model time over the grid {trial.batch1_ms:.1f} ms"
            )
        return trial, Candidate(build, described, trial)
