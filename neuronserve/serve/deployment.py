"""A deployment: neuronserve's workers serving one or several models from folders of
their own, packaged for this host's worker plan (one worker per core group, each holding
every model), started with truthful readiness.

The front (serve/front/), the SageMaker and Kubernetes entrypoints and bench each run
one. Its folder holds the workers' store (`store/`: written afresh at every start, so
nothing packaged for an earlier start is served) and their run folder (`run/`: the
supervisor's pid file, logs, the workers' sockets).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from .. import catalog, placement
from ..artifact import read_manifest
from ..packaging.model import prepare, served_truncation
from ..processes import private_dir
from ..spec import DeploySpec, FrontSection, ModelEntry
from ..workers import process
from ..workers.package import package_workers
from .model_source import find_models

if TYPE_CHECKING:
    from ..artifact import Manifest
    from ..served import ServedModel
    from ..workers.client import SocketClient
    from .front.multi_model import ModelCatalog
    from .front.serving import Serving
    from .model_source import FoundModel

log = logging.getLogger(__name__)

STORE_DIR = "store"
RUN_DIR = "run"
CATALOG_DIR = "catalog"


def model_entries(found: list[FoundModel], spec: DeploySpec) -> list[ModelEntry]:
    """The models found, each with the truncation it was packaged with unless the spec
    gives one for the whole deployment (a setting given now wins over one recorded)."""
    given = "truncation" in spec.model_fields_set and spec.truncation is not None
    return [
        f.entry().model_copy(update={"truncation": None}) if given else f.entry() for f in found
    ]


def deployment_for(spec: DeploySpec, sources: list[Path], work: Path) -> Deployment:
    """The deployment serving the models in `sources` (artifacts, a model store holding
    a .mar, a Triton repository, a workers' store), or the spec's models when none is
    given, with the spec's settings over the packaged ones."""
    found = [f for i, s in enumerate(sources) for f in find_models(s, work / f"source-{i}")]
    entries = model_entries(found, spec) if found else spec.model_entries()
    return Deployment(spec, entries, work)


def running_workers(work: Path) -> process.RunningWorkers | None:
    """The workers a Deployment in `work` started, if they are running."""
    return process.running(Path(work) / RUN_DIR)


class Deployment:
    """The workers serving `models` from `work`.

    What the spec gives reaches the workers as it is: the deployment's name and
    truncation, the worker, limits and multi-model sections. It is resolved once, here
    (`packaged`: the models' verified manifests and served names, the worker plan, the
    workers' settings), and every start packages from that. `serving_host`: the host it
    plans for is the one it serves on (the SageMaker entrypoint), so more workers than
    core groups are cut to the groups.
    """

    def __init__(
        self,
        spec: DeploySpec,
        models: list[ModelEntry],
        work: Path,
        serving_host: bool = False,
    ):
        # the workers' store, catalog and run folder: what they read as instructions, so
        # this user's alone
        self.work = private_dir(Path(work))
        self.multi_model = spec.multi_model.enabled
        if not models and not self.multi_model:
            raise ValueError("a deployment needs at least one model")
        # multi-model: the workers start empty and the front loads the models given at
        # start through the catalog, like any model loaded later (their manifests are read
        # here for their names and target; the catalog verifies each as it loads it)
        self.initial: dict[str, tuple[Manifest, Path]] = {}
        if self.multi_model:
            for m in models:
                manifest = read_manifest(m.artifact, verify=False)
                self.initial[m.served_name(manifest.name)] = (manifest, Path(m.artifact))
        multi_model = spec.multi_model
        if self.multi_model:
            first = next(iter(self.initial.values()), None)
            multi_model = multi_model.model_copy(
                update={
                    "catalog_dir": self.work / CATALOG_DIR,
                    **({"target": first[0].target} if first else {}),
                }
            )
        self.spec = spec.model_copy(
            update={
                "artifact": None,
                "name": None,
                "models": [] if self.multi_model else list(models),
                "multi_model": multi_model,
                # the front's own settings (port, keys, TLS) stay with the front
                "front": FrontSection(),
            }
        )
        self.store = self.work / STORE_DIR
        self.run_dir = self.work / RUN_DIR
        self.workers: process.RunningWorkers | None = None
        plan = None
        if self.multi_model:  # on the target of the models it will load
            plan = placement.plan(
                placement.PlanRequest.of_target(self.spec.worker, self.spec.multi_model.target),
                serving_host,
            )
        # resolved once: the manifests read and verified, each model's served name, the
        # name they are served under together, the worker plan and the workers' settings;
        # every start packages from it
        self.packaged = prepare(self.spec, "workers", plan, serving_host)
        self.name = self.packaged.name
        self.plan = self.packaged.plan

    def start(self, timeout_s: float = 600) -> None:
        """Package for this host into a fresh store and start; returns once every worker
        is ready."""
        # the store is this deployment's alone: whatever an earlier start packaged there
        # (another model, served from the same run directory before) must not load again
        if self.store.exists():
            shutil.rmtree(self.store)
        if self.multi_model:  # and nothing an earlier start loaded is wanted again
            shutil.rmtree(self.work / CATALOG_DIR, ignore_errors=True)
            catalog.write_wanted(self.work / CATALOG_DIR, {})
        package_workers(self.store, self.packaged)
        self.workers = process.start(self.store, self.run_dir, timeout_s, log.info)

    def stop(self) -> None:
        process.stop(self.run_dir, log=log.info)
        self.workers = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def stuck(self) -> str | None:
        """Why only a restart can make the workers whole (None: they are, or mend
        themselves: the supervisor replaces a dead or hung worker)."""
        if process.running(self.run_dir) is None:
            return "the workers' supervisor is no longer running"
        return None

    @property
    def tasks(self) -> str:
        """The models it starts with, as the log says them ("no model yet" for a
        multi-model deployment started empty)."""
        named = [(m.name, m.manifest.task) for m in self.packaged.models] or [
            (n, m.task) for n, (m, _) in self.initial.items()
        ]
        return ", ".join(f"{n} ({task})" for n, task in named) or (
            "no model yet (POST /models loads one)"
        )

    def served_models(self) -> dict[str, ServedModel]:
        """Each model it starts with as the front needs it, by name (none for a
        multi-model deployment: the front loads those through the catalog)."""
        truncation = {m.name: m.truncation for m in self.packaged.settings.models}
        return {
            m.name: self.served_model(m.name, m.manifest, m.artifact, truncation[m.name])
            for m in self.packaged.models
        }

    def served_model(
        self,
        name: str,
        manifest: Manifest,
        artifact: Path,
        truncation: bool | None = None,
        key: str = "",
    ) -> ServedModel:
        """One model as the front needs it: `truncation` as packaged (None: a model the
        catalog loads, as its artifact recorded unless the spec says); a multi-model load
        passes its worker name as `key`."""
        from ..served import ServedModel

        return ServedModel(
            name=name,
            manifest=manifest,
            truncation=truncation
            if truncation is not None
            else served_truncation(ModelEntry(artifact=artifact), self.spec, manifest),
            max_text_chars=self.spec.limits.max_text_chars,
            max_request_chars=self.spec.limits.max_body_bytes,
            max_chunks=self.spec.limits.max_chunks_per_request,
            tokenizer=ServedModel.tokenizer_of(manifest, artifact),
            key=key,
            calibration=ServedModel.calibration_of(manifest, artifact),
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
            else placement.model_budget(
                self.plan, cores.instance_family(), self.spec.multi_model.target
            )
        )
        return ModelCatalog(
            serving,
            self.work / CATALOG_DIR,
            self.plan.workers,
            self.plan.kind,
            self.spec.multi_model.target,
            budget,
            lambda name, key, manifest, artifact: self.served_model(
                name, manifest, artifact, key=key
            ),
            idle_unload_s,
        )

    def client(self) -> SocketClient:
        from ..workers.client import SocketClient

        return SocketClient(self.name, self.run_dir, self.plan.workers)
