"""`neuronserve validate ARTIFACT`: the compile-time check, run where the modules can run.

A Neuron artifact compiled on a build host (or for another platform) is saved unchecked
(validation_status: pending), because a compiled Neuron module only loads on a Neuron
instance. On the serving host this loads every bucket module onto one leased NeuronCore,
checks it against the eager reference the compile stored (reference.npz: padded batches
per bucket, the accuracy texts), and records the result in the manifest: passed, or
failed with the reason (a failed artifact is refused at load).
"""

from __future__ import annotations

import socket
from datetime import datetime, timezone
from pathlib import Path

from ..artifact import Manifest, read_manifest, write_manifest
from ..execution import InputLayout, Module
from ..targets import get_target
from ..tasks import get_task
from .base import CompileError, Target
from .reference import REFERENCE_FILE, Judge, Reference, Verdict, check


def runnable_target(path: Path, manifest: Manifest) -> Target:
    target = get_target(manifest.target)
    reason = target.cannot_run_here({})
    if reason:
        raise CompileError(
            f"cannot check {path} here: {reason}. Run it on a host that "
            f"serves target {manifest.target}"
        )
    return target


def load_modules(path: Path, manifest: Manifest, target: Target) -> dict[str, Module]:
    return {f: target.load(path / f) for f in sorted(set(manifest.modules.values()))}


def check_modules(path: Path, manifest: Manifest, loaded: dict[str, Module]) -> Verdict:
    """The loaded modules against the artifact's reference; raises CompileError when a
    module is unfaithful (NaN, shape, fp32 tolerance)."""
    task = get_task(manifest.task)
    field = task.accuracy_floor_field
    judge = Judge(
        task,
        manifest.precision,
        manifest.tolerance,
        field,
        manifest.accuracy_floor.get(field) if field else None,
    )
    reference = Reference.load(path / REFERENCE_FILE)
    return check(
        lambda b: loaded[manifest.module_for(b)],
        reference,
        judge,
        manifest.grid,
        InputLayout.of(manifest),
    )


def check_artifact(path: Path, manifest: Manifest) -> Verdict:
    """Load every module of `path` on one leased core here and check it."""
    target = runnable_target(path, manifest)
    with target.compiling({}):
        return check_modules(path, manifest, load_modules(path, manifest, target))


def validate_artifact(path: Path) -> Manifest:
    """Check the artifact on this host and record the outcome in its manifest."""
    path = Path(path)
    manifest = read_manifest(path)
    if manifest.exported is not None:
        raise CompileError(
            f"{path} holds a module {manifest.exported.by} compiled, served as it is: "
            "neuronserve has no eager reference for it. Compile its source model "
            "(compile --model <the export> --recompile) for an artifact checked here"
        )
    where = f"{socket.gethostname()} at {datetime.now(timezone.utc).isoformat(timespec='seconds')}"
    try:
        verdict = check_artifact(path, manifest)
    except CompileError as e:
        if "cannot check" in str(e):
            raise
        _record(path, manifest, "failed", f"checked on {where}: {e}")
        raise
    if verdict.refused:
        _record(path, manifest, "failed", f"checked on {where}: {verdict.refused}")
        raise CompileError(
            f"precision {manifest.precision} refused on this host: "
            f"{verdict.refused}. Recompile with a higher precision, or a lower "
            "accuracy floor if that is acceptable for your use."
        )
    manifest.validation = verdict.validation
    manifest.accuracy = verdict.accuracy
    for trial in manifest.precision_trials:
        if trial.precision == manifest.precision:
            trial.accuracy, trial.passed, trial.reason = verdict.accuracy, True, None
    return _record(path, manifest, "passed", f"checked on {where}")


def _record(path: Path, manifest: Manifest, status: str, note: str) -> Manifest:
    manifest.validation_status = status  # type: ignore[assignment]
    manifest.validation_note = note
    write_manifest(path, manifest)
    return manifest
