"""Which precision an artifact gets: every candidate is built and checked against the
fp32 eager reference (reference.py) through the serving path; one under the task's
accuracy floor is refused. With several candidates (`precision: auto`) a target that can
time them here keeps the fastest that passes (batch-1 model time over the grid), a
Neuron target the first that passes (its order is fastest first on a NeuronCore).

Where the target's modules cannot run on this host (a Neuron build host), only the
first candidate is built, and its check is left to `neuronserve validate`.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..artifact import BucketValidation, PrecisionTrial
from ..buckets import BucketGrid
from ..execution import Executor
from .base import CompileError, Target
from .build import Build, build_precision
from .context import CompileContext
from .examples import Examples
from .reference import Judge, Reference, check

if TYPE_CHECKING:
    from ..spec import CompileSection


def candidates(section: CompileSection, target: Target) -> tuple[tuple[str, ...], bool]:
    """(candidate builds to try, whether the user named the precision). A named precision
    may have several builds on a target (CPU fp32: TorchScript, ONNX Runtime, OpenVINO);
    they are timed against each other as auto's candidates are. A named module format
    keeps only its own builds."""
    if section.precision != "auto":
        variants = getattr(target, "variants", None)
        builds = variants(section.precision) if variants else (section.precision,)
    else:
        builds = tuple(getattr(target, "auto_precisions", ("fp32",)))
    if section.module_format == "auto":
        return builds, section.precision != "auto"
    format_of = target.module_format_of  # type: ignore[attr-defined] # the spec checked: cpu
    mine = tuple(b for b in builds if format_of(b) == section.module_format)
    if not mine:
        raise CompileError(
            f"module_format {section.module_format} has no {section.precision} build on target "
            f"{target.name}; its builds: " + ", ".join(sorted({format_of(b) for b in builds}))
        )
    return mine, section.precision != "auto"


def batch1_ms(executor: Executor, examples: Examples, grid: BucketGrid) -> float:
    """Sum over the grid's sequence lengths of the best of three batch-1 runs: what
    `precision: auto` ranks candidates by. Two warm-up calls per shape first (TorchScript
    specialises on the second)."""
    total = 0.0
    for seq in grid.sequence_lengths:
        rows = [examples.full_row(seq)]
        times = []
        for i in range(5):
            t0 = time.perf_counter()
            executor.run(rows)
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
        total += min(times)
    return total


def bucket_costs(
    executor: Executor, examples: Examples, grid: BucketGrid, rounds: int = 3
) -> dict[str, float]:
    """Each bucket's time full of real text, best of `rounds` after a warm-up round (ms):
    the artifact keeps them so the Runner splits a batch into the bucket runs that finish
    soonest on this kind of host.

    Rounds go over every bucket in turn rather than one bucket at a time: the split
    compares buckets with each other (four batch-1 runs against one batch-4), so a busy
    moment on a shared host must not land on one bucket's samples only."""
    rows = {b.key: [examples.full_row(b.seq)] * b.batch for b in grid.buckets}
    best = dict.fromkeys(rows, float("inf"))
    for i in range(rounds + 1):
        for bucket in grid.buckets:
            t0 = time.perf_counter()
            executor.run_bucket(rows[bucket.key], bucket)
            if i:
                best[bucket.key] = min(best[bucket.key], (time.perf_counter() - t0) * 1e3)
    return {key: round(ms, 3) for key, ms in best.items()}


@dataclass
class Candidate:
    build: Build
    # what the target reports about this compile for the manifest (precision the compiler
    # runs, compiler args, ...)
    described: dict
    trial: PrecisionTrial
    # how each bucket compared with the reference (empty while unchecked)
    validation: list[BucketValidation] = field(default_factory=list)


@dataclass
class Choice:
    kept: Candidate
    reference: Reference
    trials: list[PrecisionTrial] = field(default_factory=list)
    # why the kept build is not checked yet (its modules cannot run on this host)
    pending: str | None = None
    # the kept build's measured bucket times (bucket_costs); empty when pending
    bucket_ms: dict[str, float] = field(default_factory=dict)


class PrecisionSearch:
    def __init__(self, ctx: CompileContext, folder: Path):
        self.ctx, self.folder = ctx, folder
        self.precisions, self.named = candidates(ctx.job.compile, ctx.target)
        task = ctx.task
        self.floor_field = task.accuracy_floor_field
        self.floor = getattr(ctx.job.accuracy, self.floor_field) if self.floor_field else None
        # fp32 eager on padded text per bucket and on the accuracy texts, computed once
        self.reference = Reference.compute(ctx)
        self.pending = ctx.target.cannot_run_here(ctx.options)

    def run(self) -> Choice:
        if self.pending:
            return self._unchecked()
        trials, kept = [], []
        for precision in self.precisions:
            trial, candidate = self.try_precision(precision)
            trials.append(trial)
            if candidate is not None:
                kept.append(candidate)
                if not self.ctx.target.auto_times_candidates:
                    break
        if not kept and self.named:
            why = "; ".join(
                f"{t.reason} ({t.module_format})" if len(trials) > 1 else str(t.reason)
                for t in trials
            )
            if not any(t.accuracy for t in trials):  # none could even be built here
                raise CompileError(f"precision {trials[0].precision} cannot be built here: {why}")
            raise CompileError(
                f"precision {trials[0].precision} refused: {why}, on "
                f"{len(self.reference.accuracy_rows)} texts. Use a higher precision, or "
                f"lower `{self.floor_field}` explicitly if that accuracy is acceptable for "
                "your use."
            )
        if not kept:
            raise CompileError(
                "no precision met the accuracy floor: "
                + "; ".join(f"{t.precision} ({t.module_format}): {t.reason}" for t in trials)
            )
        best = min(kept, key=lambda c: c.trial.batch1_ms or 0.0)
        ctx = self.ctx
        ctx.say("timing every bucket of the kept build ...")
        costs = bucket_costs(best.build.executor(ctx), ctx.examples, ctx.grid)
        return Choice(best, self.reference, trials, bucket_ms=costs)

    def _described(self, precision: str) -> dict:
        ctx = self.ctx
        try:
            return ctx.target.describe({**ctx.options, "precision": precision}, ctx.eager)
        except ValueError as e:
            raise CompileError(str(e)) from None

    def _unchecked(self) -> Choice:
        precision = self.precisions[0]
        described = self._described(precision)
        folder = self.folder / precision
        folder.mkdir(parents=True)
        build = build_precision(self.ctx, precision, folder, self.reference, load=False)
        trial = PrecisionTrial(
            precision=described["precision"],
            module_format=described.get("module_format"),
            passed=None,
            reason=f"not checked here: {self.pending}",
        )
        self.ctx.say(
            f"precision {trial.precision}: compiled, not checked: {self.pending}. "
            "Run `neuronserve validate ARTIFACT` on the serving host before serving."
        )
        return Choice(
            Candidate(build, described, trial), self.reference, [trial], pending=self.pending
        )

    def try_precision(self, precision: str) -> tuple[PrecisionTrial, Candidate | None]:
        ctx, task = self.ctx, self.ctx.task
        described = self._described(precision)
        effective = described["precision"]
        unavailable = getattr(ctx.target, "unavailable", None)
        why = unavailable(precision, self.named) if unavailable else None
        if why:
            ctx.say(f"precision {effective} ({described.get('module_format')}): not built, {why}")
            trial = PrecisionTrial(
                precision=effective,
                module_format=described.get("module_format"),
                passed=False,
                reason=why,
            )
            return trial, None
        folder = self.folder / precision
        folder.mkdir(parents=True)
        build = build_precision(ctx, precision, folder, self.reference)
        judge = Judge(task, effective, ctx.job.compile.tolerance, self.floor_field, self.floor)
        verdict = check(build.module_for, self.reference, judge, ctx.grid, ctx.layout)
        trial = PrecisionTrial(
            precision=effective,
            module_format=described.get("module_format"),
            accuracy=verdict.accuracy,
            passed=verdict.refused is None,
            reason=verdict.refused,
        )
        name = f"{effective} ({trial.module_format})" if trial.module_format else effective
        if verdict.refused:
            shutil.rmtree(folder)
            ctx.say(f"precision {name}: refused, {verdict.refused}")
            return trial, None
        value = verdict.accuracy.get(task.accuracy_metric)
        if len(self.precisions) > 1 and ctx.target.auto_times_candidates:
            trial.batch1_ms = batch1_ms(build.executor(ctx), ctx.examples, ctx.grid)
            ctx.say(
                f"precision {name}: {task.accuracy_metric} {value:.5f}, batch-1 "
                f"model time over the grid {trial.batch1_ms:.1f} ms"
            )
        return trial, Candidate(build, described, trial, verdict.validation)
