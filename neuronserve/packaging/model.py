"""What every packager derives from a spec's artifacts before writing anything: the
verified manifests, the models' names, the worker plan for this host (each worker holds
every model), its memory plan, and the settings the adapters read back
(neuronserve.worker).

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
from typing import Any, TypeVar

from .. import cores, placement
from ..artifact import Manifest, read_manifest
from ..buckets import engine_batch_sizes
from ..sources import FoundModel, ModelSourceError
from ..spec import DeploySpec, LimitsSection, ModelEntry, WorkerSection
from ..targets import pipeline_depth
from ..worker import MODELS_DIR, ModelSettings, WorkerSettings

# the largest batch an engine forms in a multi-model deployment, whose models' grids are
# unknown when it starts (a Runner runs a batch beyond its grid in pieces)
MULTI_MODEL_MAX_BATCH = 32


def found_in(model_dir: Path, settings: WorkerSettings) -> list[FoundModel]:
    """The models a packaged model folder holds, from the settings packaged with them."""
    if not settings.models:
        raise ModelSourceError(f"{model_dir} was packaged without the models it holds")
    return [FoundModel(model_dir / m.artifact, m.name, m.truncation) for m in settings.models]


class PackagingError(RuntimeError):
    pass


def engine_batches(manifest: Manifest) -> list[int]:
    """The batch sizes an engine should form for one model: those its bucket times say
    are worth it, as many device calls per batch as its target pipelines."""
    return engine_batch_sizes(manifest.grid, manifest.bucket_ms, pipeline_depth(manifest.target))


@dataclass(frozen=True)
class PackagedModel:
    """One model of a deployment, as packaged."""

    manifest: Manifest
    name: str
    artifact: Path
    # where the engine's model directory holds its artifact (models/<name>)
    folder: str


@dataclass(frozen=True)
class Packaged:
    """A deployment resolved (prepare): what every engine packages, from this alone: the
    models, the name the engine serves them under, the worker plan (workers = core
    groups, each holding every model), the settings the adapters read back, and the
    worker and limits sections the engine's own queues and bounds are set from."""

    models: list[PackagedModel]
    name: str
    plan: placement.WorkerPlan
    settings: WorkerSettings
    memory: placement.MemoryPlan
    # what the engine's own batching, queues and limits are set from
    worker: WorkerSection
    limits: LimitsSection

    @property
    def target(self) -> str:
        return self.models[0].manifest.target if self.models else self.settings.target


def prepare(
    spec: DeploySpec,
    what: str = "workers",
    plan: placement.WorkerPlan | None = None,
    serving_host: bool = False,
) -> Packaged:
    """Refuse a broken artifact, two models of one name, artifacts compiled for
    different targets and a plan whose workers cannot hold every model in memory; plan
    workers unless the caller has (`what` names them in the warning printed when this
    host has fewer core groups than asked for; `serving_host`: placement.plan's); settle
    the settings."""
    entries = spec.model_entries()
    if spec.multi_model.enabled:
        return _prepare_multi_model(spec, what, plan)
    if not entries:
        raise PackagingError("no artifact: pass the artifact directory (or several)")
    models = []
    for entry in entries:
        manifest = read_manifest(entry.artifact)
        name = entry.served_name(manifest.name)
        models.append(PackagedModel(manifest, name, Path(entry.artifact), f"{MODELS_DIR}/{name}"))
    _check_together(models)
    manifests = [m.manifest for m in models]
    if plan is None:
        try:
            plan = placement.plan(placement.PlanRequest.of(spec.worker, manifests), serving_host)
        except placement.PlacementError as e:
            raise PackagingError(str(e)) from None
    for manifest in manifests:
        problem = placement.device_memory_problem(
            manifest.target,
            len(set(manifest.modules.values())),
            int(manifest.compiler.get("weight_bytes", 0)),
            int(manifest.compiler.get("cores_per_module", 1)),
            cores.instance_family(),
        )
        if problem:
            raise PackagingError(problem)
    memory = placement.memory_plan(
        [(m.name, m.manifest, m.artifact) for m in models], plan, cores.instance_family()
    )
    if not memory.fits:
        raise PackagingError(memory.refusal())
    _warn(plan, what)
    settings = _worker_settings(
        spec,
        plan,
        manifests[0].target,
        models=[
            ModelSettings(
                name=m.name,
                artifact=m.folder,
                truncation=served_truncation(entry, spec, m.manifest),
            )
            for m, entry in zip(models, entries, strict=True)
        ],
    )
    name = models[0].name if len(models) == 1 else spec.deployment_name
    return Packaged(models, name, plan, settings, memory, spec.worker, spec.limits)


def _prepare_multi_model(
    spec: DeploySpec, what: str, plan: placement.WorkerPlan | None
) -> Packaged:
    """A multi-model deployment packages no model: its workers start empty, on the
    spec's target, and load what the front's catalog names (neuronserve.catalog)."""
    if spec.multi_model.catalog_dir is None:
        raise PackagingError(
            "multi-model serving runs behind the front, which loads the models: "
            "use `neuronserve serve front` (or the SageMaker/Kubernetes container)"
        )
    if plan is None:
        try:
            plan = placement.plan(placement.PlanRequest.of_target(spec.worker, spec.compile.target))
        except placement.PlacementError as e:
            raise PackagingError(str(e)) from None
    _warn(plan, what)
    settings = _worker_settings(
        spec, plan, spec.compile.target, catalog=str(Path(spec.multi_model.catalog_dir).resolve())
    )
    memory = placement.memory_plan([], plan, cores.instance_family())
    return Packaged([], spec.deployment_name, plan, settings, memory, spec.worker, spec.limits)


def _worker_settings(
    spec: DeploySpec, plan: placement.WorkerPlan, target: str, **models: Any
) -> WorkerSettings:
    """What every worker reads back: the plan's cores, the spec's limits, and `models`
    (the models to load, or the catalog to follow)."""
    return WorkerSettings(
        target=target,
        core_kind=plan.kind,
        cores_per_worker=plan.cores_per_worker,
        neuron_cores=spec.worker.neuron_cores,
        max_client_batch=spec.limits.max_client_batch,
        max_text_chars=spec.limits.max_text_chars,
        max_json_depth=spec.limits.max_json_depth,
        max_answer_bytes=spec.limits.max_answer_bytes,
        max_chunks=spec.limits.max_chunks_per_request,
        max_request_chars=spec.limits.max_body_bytes,
        batches_in_flight=spec.worker.batches_in_flight,
        **models,
    )


def _warn(plan: placement.WorkerPlan, what: str) -> None:
    warning = plan.warning(what)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)


def _check_together(models: list[PackagedModel]) -> None:
    """Names are how requests find their model, and one worker loads every model onto
    one kind of core: refuse two of one name, or artifacts for different targets."""
    seen: dict[str, Path] = {}
    for m in models:
        if m.name in seen:
            raise PackagingError(
                f"two models are named {m.name!r} ({seen[m.name]} and {m.artifact}): model "
                "names address requests, so each must be unique (compile one with another "
                "--name, or give it a `name` in the spec's `models`)"
            )
        seen[m.name] = m.artifact
    targets = {m.manifest.target for m in models}
    if len(targets) > 1:
        listed = ", ".join(f"{m.name}: {m.manifest.target}" for m in models)
        raise PackagingError(
            f"the models were compiled for different targets ({listed}): every worker loads "
            "every model onto the same cores, so one deployment serves one target; compile "
            "them for one target or deploy them apart"
        )


def served_truncation(entry: ModelEntry, spec: DeploySpec, manifest: Manifest) -> bool:
    """A model's answer to over-long text: its own entry's, else the deployment's, else
    what its artifact recorded."""
    return recorded_unless_given(
        entry.truncation, recorded_unless_given(spec.truncation, manifest.truncation)
    )


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
