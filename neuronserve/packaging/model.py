"""What every packager derives from an artifact and a spec before writing anything: the
verified manifest, the model name, the worker plan for this host and the settings the
adapters read back (neuronserve.worker).

A deployment setting the artifact recorded (its name, truncation) is what the servers
use unless it is given again at packaging time: `recorded_unless_given` is the one place
that decides, for `package torchserve`, `package triton` and the SageMaker entrypoint,
which packages again through here.
"""

from __future__ import annotations

import sys
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


def prepare(artifact: Path, spec: DeploySpec, what: str = "workers") -> PackagedModel:
    """Refuse a broken artifact, plan workers (`what` names them in the warning printed
    when this host has fewer core groups than asked for) and settle the settings."""
    manifest = read_manifest(artifact)
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
        truncation=recorded_unless_given(spec.truncation, manifest.tokenizer.truncation),
        max_client_batch=spec.max_client_batch,
    )
    return PackagedModel(manifest, recorded_unless_given(spec.name, manifest.name), plan, settings)


T = TypeVar("T")


def recorded_unless_given(given: T | None, recorded: T) -> T:
    """The value given at packaging time (a flag or the spec), else the artifact's: never
    a packaging default."""
    return recorded if given is None else given
