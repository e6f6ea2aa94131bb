"""What every packager derives from an artifact and a spec before writing anything: the
verified manifest, the model name, the worker plan for this host and the settings the
adapters read back (neuronserve.worker)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from .. import placement
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
    warning = plan.warning(what)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    settings = WorkerSettings(
        target=manifest.target,
        core_kind=plan.kind,
        cores_per_worker=plan.cores_per_worker,
        neuron_cores=spec.neuron_cores,
        truncation=spec.truncation,
    )
    return PackagedModel(manifest, spec.name or manifest.name, plan, settings)
