"""A deployment: one engine serving one or several models from folders of its own,
packaged for this host's worker plan (one worker per core group, each holding every
model), on loopback ports of its own, started with truthful readiness.

The front (serve/front/), the SageMaker and Kubernetes entrypoints and bench each run
one. Its folder holds the engine's store (`store/`: a model store or Triton repository
written afresh at every start, so nothing packaged for an earlier start is served) and
the engine's run directory (`run/`: pid file, logs).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import catalog, placement
from ..artifact import read_manifest
from ..engines import engine
from ..packaging.model import recorded_unless_given, served_truncation
from ..spec import DeploySpec, ModelEntry, load_spec
from .process import free_ports, private_dir

if TYPE_CHECKING:
    from ..artifact import Manifest
    from ..engines.base import Engine
    from .front.clients import EngineClient
    from .front.model import ServedModel
    from .front.multi_model import ModelCatalog
    from .front.serving import Serving
    from .model_source import FoundModel

log = logging.getLogger(__name__)

STORE_DIR = "store"
RUN_DIR = "run"
CATALOG_DIR = "catalog"
# how long the engine's keys the front holds live (minutes): longer than any deployment
FRONT_KEY_MINUTES = 10 * 365 * 24 * 60


def engine_settings(spec: DeploySpec) -> dict[str, Any]:
    """The worker settings a spec gives explicitly (`DeploySpec.worker_fields`), and the
    name several models are served under."""
    given = spec.model_fields_set
    settings = {k: getattr(spec, k) for k in DeploySpec.worker_fields() if k in given}
    settings["deployment_name"] = spec.deployment_name
    if spec.multi_model:
        settings.update(multi_model=True, target=spec.target)
    return {k: v for k, v in settings.items() if v is not None}


def model_entries(found: list[FoundModel], spec: DeploySpec) -> list[ModelEntry]:
    """The models found, each with the truncation it was packaged with unless the spec
    gives one for the whole deployment (a setting given now wins over one recorded)."""
    given = "truncation" in spec.model_fields_set and spec.truncation is not None
    return [
        f.entry().model_copy(update={"truncation": None}) if given else f.entry() for f in found
    ]


def running_engine(work: Path, name: str) -> Engine | None:
    """The engine a Deployment in `work` started, if it is running."""
    found = engine(name, Path(work) / RUN_DIR)
    return found if found.running() else None


class Deployment:
    """Engine `engine_name` serving `models` from `work`.

    `settings` are spec fields for this deployment (workers, cores_per_worker, layout,
    limits, ...); ports and folders are chosen here. `plan`, when the caller planned the
    workers already (the SageMaker entrypoint does, from SageMaker's settings), is used
    as it is instead of planning again.
    """

    def __init__(
        self,
        engine_name: str,
        models: list[ModelEntry],
        work: Path,
        settings: dict[str, Any],
        plan: placement.WorkerPlan | None = None,
    ):
        # the engine's store, catalog and run folder: what its workers read as
        # instructions, so this user's alone
        self.work = private_dir(Path(work))
        self.engine = engine(engine_name, self.work / RUN_DIR)
        self.multi_model = bool(settings.get("multi_model"))
        if not models and not self.multi_model:
            raise ValueError("a deployment needs at least one model")
        # packaging verifies the artifacts' checksums when the engine starts
        self.manifests = {
            recorded_unless_given(m.name, mf.name): (mf, Path(m.artifact))
            for m in models
            for mf in [read_manifest(m.artifact, verify=False)]
        }
        # multi-model: the workers start empty and the front loads these through the
        # catalog, like any model loaded later
        self.initial = list(models) if self.multi_model else []
        if self.multi_model and self.manifests:
            settings = {**settings, "target": next(iter(self.manifests.values()))[0].target}
        kind = type(self.engine)
        self.spec: DeploySpec = load_spec(
            None,
            {
                "models": [] if self.multi_model else [m.model_dump() for m in models],
                "catalog_dir": self.work / CATALOG_DIR if self.multi_model else None,
                # loopback only, behind the front, and keys even so: another local user
                # must not reach the engine around the front's keys and limits (the front
                # reads TorchServe's from its 0700 run directory; the inference key lives
                # ten years instead of TorchServe's hour). A folder instead of a zip, so a
                # start does not pack the artifact again
                "token_auth": True,
                "token_expiration_min": FRONT_KEY_MINUTES,
                "triton_inference_key": True,
                "bind_address": "127.0.0.1",
                "archive_format": "no-archive",
                kind.store_field: self.work / STORE_DIR,
                **dict(zip(kind.port_fields, free_ports(len(kind.port_fields)), strict=True)),
                **settings,
            },
        )
        # the name the engine serves them under: the model's own when there is one
        self.name = (
            next(iter(self.manifests))
            if len(self.manifests) == 1 and not self.multi_model
            else self.spec.deployment_name
        )
        self.plan = plan or placement.plan(
            placement.PlanRequest.of(self.spec, [m for m, _ in self.manifests.values()])
            if self.manifests
            else placement.PlanRequest.of_target(self.spec, self.spec.target)
        )

    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def store(self) -> Path:
        return self.engine.store(self.spec)

    def start(self) -> None:
        """Package for this host into a fresh store and start; returns once every worker
        is ready."""
        # the store is this deployment's alone: whatever an earlier start packaged there
        # (another model, served from the same run directory before) must not load again
        if self.store.exists():
            shutil.rmtree(self.store)
        if self.multi_model:  # and nothing an earlier start loaded is wanted again
            shutil.rmtree(self.work / CATALOG_DIR, ignore_errors=True)
            catalog.write_wanted(self.work / CATALOG_DIR, {})
        self.engine.package(self.spec, self.plan)
        self.engine.start(self.spec, log=log.info)

    def stop(self) -> None:
        self.engine.stop(log=log.info)

    @property
    def tasks(self) -> str:
        return ", ".join(f"{n} ({m.task})" for n, (m, _) in self.manifests.items())

    def served_models(self) -> dict[str, ServedModel]:
        """Each model as the front needs it, by name."""
        out = {}
        for entry in self.spec.model_entries():
            manifest = read_manifest(entry.artifact, verify=False)
            name = recorded_unless_given(entry.name, manifest.name)
            out[name] = self.served_model(name, manifest, Path(entry.artifact), entry)
        return out

    def served_model(
        self,
        name: str,
        manifest: Manifest,
        artifact: Path,
        entry: ModelEntry | None = None,
        key: str = "",
    ) -> ServedModel:
        """One model as the front needs it (a multi-model load passes its worker name)."""
        from .front.model import ServedModel

        return ServedModel(
            name=name,
            manifest=manifest,
            engine=self.engine.name,
            truncation=served_truncation(
                entry or ModelEntry(artifact=artifact), self.spec, manifest
            ),
            max_text_chars=self.spec.max_text_chars,
            tokenizer=ServedModel.tokenizer_of(manifest, artifact),
            key=key,
        )

    def catalog(
        self, serving: Serving, budget_mb: float | None, idle_unload_s: float | None
    ) -> ModelCatalog:
        """The front's keeper of this multi-model deployment's models."""
        from .. import cores
        from .front.multi_model import ModelCatalog

        budget = (
            int(budget_mb * 2**20)
            if budget_mb is not None
            else placement.model_budget(self.plan, cores.instance_family(), self.spec.target)
        )
        return ModelCatalog(
            serving,
            self.work / CATALOG_DIR,
            self.plan.workers,
            self.plan.kind,
            self.spec.target,
            budget,
            lambda name, key, manifest, artifact: self.served_model(
                name, manifest, artifact, key=key
            ),
            idle_unload_s,
        )

    def client(self, models: dict[str, ServedModel], connections: int) -> EngineClient:
        return self.engine.client(self.name, models, self.plan.workers, connections)
