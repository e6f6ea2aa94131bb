"""What every packager derives from an artifact and a spec before writing anything: the
verified manifest, the model name, the worker plan for this host and the settings the
adapters read back (neuronserve.worker).

A deployment setting the artifact recorded (its name, truncation) is what the servers
use unless it is given again at packaging time: `recorded_unless_given` is the one place
that decides, for `package torchserve`, `package triton` and the SageMaker entrypoint,
which packages again through here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .. import cores, placement
from ..artifact import Manifest, read_manifest
from ..spec import DeploySpec
from ..worker import WorkerSettings


class PackagingError(RuntimeError):
    pass


@dataclass(frozen=True)
class PackagedModel:
    manifest: Manifest
    name: str
    plan: placement.WorkerPlan
    settings: WorkerSettings


def prepare(
    artifact: Path,
    spec: DeploySpec,
    what: str = "workers",
    plan: placement.WorkerPlan | None = None,
) -> PackagedModel:
    """Refuse a broken artifact, plan workers unless the caller has (`what` names them in
    the warning printed when this host has fewer core groups than asked for) and settle
    the settings."""
    manifest = read_manifest(artifact)
    if plan is None:
        try:
            plan = placement.plan(placement.PlanRequest.of(spec, manifest))
        except placement.PlacementError as e:
            raise PackagingError(str(e)) from None
    problem = placement.device_memory_problem(
        manifest.target,
        len(set(manifest.modules.values())),
        int(manifest.compiler.get("weight_bytes", 0)),
        int(manifest.compiler.get("cores_per_module", 1)),
        cores.instance_family(),
    )
    if problem:
        raise PackagingError(problem)
    warning = plan.warning(what)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    settings = WorkerSettings(
        target=manifest.target,
        core_kind=plan.kind,
        cores_per_worker=plan.cores_per_worker,
        neuron_cores=spec.neuron_cores,
        truncation=recorded_unless_given(spec.truncation, manifest.truncation),
        max_client_batch=spec.max_client_batch,
        max_text_chars=spec.max_text_chars,
        max_json_depth=spec.max_json_depth,
    )
    return PackagedModel(manifest, recorded_unless_given(spec.name, manifest.name), plan, settings)


T = TypeVar("T")


def recorded_unless_given(given: T | None, recorded: T) -> T:
    """The value given at packaging time (a flag or the spec), else the artifact's: never
    a packaging default."""
    return recorded if given is None else given


@contextlib.contextmanager
def staged(parent: Path) -> Iterator[Path]:
    """A private staging folder inside `parent` (same file system, so the result moves
    into place with a rename), removed afterwards whatever happens."""
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".neuronserve-staging-", dir=parent))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def retire(parent: Path, name: str, stage: Path) -> None:
    """Move parent/<name>, if there, into the staging folder `stage`, which removes it with
    itself: the one way packaging removes anything, and only an entry of `parent`."""
    parent = parent.resolve()
    old = parent / name
    if old.parent != parent or stage.resolve().parent != parent:
        raise PackagingError(f"refusing to remove {old}: not an entry of {parent}")
    if old.is_dir() and not old.is_symlink():
        os.replace(old, stage / f".retired-{name}")
    elif old.exists() or old.is_symlink():
        old.unlink()


def put_in_place(built: Path, parent: Path) -> Path:
    """Move `built` (made in a `staged` folder of `parent`) to parent/<its name>,
    retiring what was there."""
    retire(parent, built.name, built.parent)
    dest = parent.resolve() / built.name
    os.replace(built, dest)
    return dest
