"""A deployment: one engine serving an artifact from folders of its own, packaged for
this host's worker plan, on loopback ports of its own, started with truthful readiness.

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

from .. import placement
from ..artifact import read_manifest
from ..packaging.model import recorded_unless_given
from ..spec import DeploySpec, load_spec
from .engines import engine
from .process import free_ports

if TYPE_CHECKING:
    from ..worker import WorkerSettings
    from .engine import Engine
    from .front.clients import EngineClient
    from .front.model import ServedModel

log = logging.getLogger(__name__)

STORE_DIR = "store"
RUN_DIR = "run"


def engine_settings(spec: DeploySpec, packaged: WorkerSettings | None) -> dict[str, Any]:
    """The worker settings a spec gives explicitly (`DeploySpec.worker_fields`);
    truncation, if the spec leaves it, is what the model was packaged with (a .mar's or
    a Triton repository's)."""
    given = spec.model_fields_set
    settings = {k: getattr(spec, k) for k in DeploySpec.worker_fields() if k in given}
    if "truncation" not in settings and packaged is not None:
        settings["truncation"] = packaged.truncation
    return {k: v for k, v in settings.items() if v is not None}


def running_engine(work: Path, name: str) -> Engine | None:
    """The engine a Deployment in `work` started, if it is running."""
    found = engine(name, Path(work) / RUN_DIR)
    return found if found.running() else None


class Deployment:
    """Engine `engine_name` serving `artifact` from `work`.

    `settings` are spec fields for this deployment (workers, cores_per_worker, layout,
    limits, ...); ports and folders are chosen here. `plan`, when the caller planned the
    workers already (the SageMaker entrypoint does, from SageMaker's settings), is used
    as it is instead of planning again.
    """

    def __init__(
        self,
        engine_name: str,
        artifact: Path,
        work: Path,
        settings: dict[str, Any],
        plan: placement.WorkerPlan | None = None,
    ):
        self.work, self.artifact = Path(work), Path(artifact)
        self.engine = engine(engine_name, self.work / RUN_DIR)
        # packaging verifies the artifact's checksums when the engine starts
        self.manifest = read_manifest(artifact, verify=False)
        kind = type(self.engine)
        self.spec: DeploySpec = load_spec(
            None,
            {
                "artifact": artifact,
                # loopback only, behind the front: no keys, and a folder instead of a
                # zip so a start does not pack the artifact again
                "token_auth": False,
                "bind_address": "127.0.0.1",
                "archive_format": "no-archive",
                kind.store_field: self.work / STORE_DIR,
                **dict(zip(kind.port_fields, free_ports(len(kind.port_fields)), strict=True)),
                **settings,
            },
        )
        self.name = recorded_unless_given(self.spec.name, self.manifest.name)
        self.plan = plan or placement.plan(placement.PlanRequest.of(self.spec, self.manifest))

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
        self.engine.package(self.artifact, self.spec, self.plan)
        self.engine.start(self.spec, log=log.info)

    def stop(self) -> None:
        self.engine.stop(log=log.info)

    def served_model(self) -> ServedModel:
        from .front.model import ServedModel

        return ServedModel(
            name=self.name,
            manifest=self.manifest,
            engine=self.engine.name,
            truncation=recorded_unless_given(self.spec.truncation, self.manifest.truncation),
            max_text_chars=self.spec.max_text_chars,
            tokenizer=ServedModel.tokenizer_of(self.manifest, self.artifact),
        )

    def client(self, model: ServedModel, connections: int) -> EngineClient:
        return self.engine.client(model, self.plan.workers, connections)
