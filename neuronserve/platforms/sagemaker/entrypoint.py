"""The SageMaker `serve` entrypoint: neuronserve's front with SageMaker's settings.

SageMaker starts the container with `serve`, then polls `GET /ping` and sends
`POST /invocations` on SAGEMAKER_BIND_TO_PORT. The front (serve/front/) answers both:
/ping is 503 until every worker has loaded and warmed up. The workers run behind it,
packaged for this host's core groups so SAGEMAKER_MODEL_SERVER_WORKERS can be honoured
(and capped). SageMaker's contract has no API key (callers reach the endpoint
through AWS's authenticated API), so the front asks for none here; every other route of
the front (OpenAI, text-embeddings-inference, /metrics) is served too.

The same image runs on Kubernetes (`package kubernetes`) with NEURONSERVE_PLATFORM=
kubernetes: there the port is open to the cluster, so the front requires the key in
NEURONSERVE_API_KEY (from a Secret) and refuses to start without one.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ...artifact import MANIFEST
from ...compile.cache import resolved
from ...processes import private_dir
from ...serve.deployment import Deployment, model_entries
from ...serve.front.config import FrontConfig
from ...serve.front.keys import ENV_KEY
from ...serve.front.server import configure_logging, run
from ...serve.model_source import FoundModel, ModelSourceError, find_models
from ...spec import DeploySpec, SpecError, from_environment, load_spec
from .container import model_source

log = logging.getLogger("neuronserve.sagemaker")


PLATFORMS = ("sagemaker", "kubernetes")
# models named by Hugging Face Hub id (or a folder in the image), compiled at start
HUB_MODELS = "HF_MODEL_ID"


class PlatformError(RuntimeError):
    pass


def platform() -> str:
    """NEURONSERVE_PLATFORM: sagemaker (no key, SageMaker's contract) or kubernetes. Said
    explicitly: SageMaker gives its container no mark of its own (it runs `docker run
    image serve`, as anyone may), and the image run elsewhere must not answer every
    address without a key by default."""
    name = os.environ.get("NEURONSERVE_PLATFORM", "")
    if not name:
        raise PlatformError(
            "NEURONSERVE_PLATFORM is not set: sagemaker for SageMaker's contract (no API "
            "key, every address; set it in the model's environment), or kubernetes (API "
            "keys, NEURONSERVE_API_KEY)"
        )
    if name not in PLATFORMS:
        raise PlatformError(f"NEURONSERVE_PLATFORM={name!r}: use {' or '.join(PLATFORMS)}")
    if name == "kubernetes" and not os.environ.get(ENV_KEY, "").strip():
        raise PlatformError(
            f"{ENV_KEY} is empty: on Kubernetes the front needs the API key from its "
            "Secret (kubectl create secret generic <name>-api-key --from-literal="
            "api-key=...)"
        )
    return name


def sagemaker_spec(work: Path) -> DeploySpec:
    """The deployment spec SageMaker's (or the Kubernetes pod's) environment describes:
    the container's defaults (SageMaker's port and timeout, every address), then every
    variable declared on a spec field (spec.environment_variables), then the models."""
    try:
        given = from_environment(os.environ)
    except SpecError as e:
        raise PlatformError(str(e)) from None
    sections: dict[str, dict[str, object]] = {
        "front": {"address": "0.0.0.0", "port": 8080, "run_dir": work, "deadline_s": 60},
        "worker": {"response_timeout_s": 60},
    }
    for key, fields in given.items():
        sections.setdefault(key, {}).update(fields)
        for field, value in fields.items():
            log.info("%s.%s = %s, from the environment", key, field, _shown(value))
    hub = [m.strip() for m in os.environ.get(HUB_MODELS, "").split(",") if m.strip()]
    if not hub and not sections.get("multi_model", {}).get("enabled"):
        # model data whose root is a Hugging Face model folder (the toolkit's model.tar.gz)
        folder = hugging_face_folder()
        hub = [str(folder)] if folder is not None else []
    if hub:
        # as Hugging Face's own SageMaker containers take a model: HF_MODEL_ID (here one
        # or several, comma-separated), HF_MODEL_REVISION for the one, HF_TASK
        refuse_remote_code()
        revision = os.environ.get("HF_MODEL_REVISION") or None
        task = os.environ.get("HF_TASK") or None
        task = TOOLKIT_TASKS.get(task, task) if task else None
        sections["models"] = [  # type: ignore[assignment]
            {"model": m, "revision": revision if len(hub) == 1 else None, "task": task} for m in hub
        ]
    return load_spec(None, sections)


def _shown(value: object) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


# the pipelines' other names for tasks here (transformers' task aliases)
TOOLKIT_TASKS = {"sentiment-analysis": "text-classification", "ner": "token-classification"}


def refuse_remote_code() -> None:
    """HF_TRUST_REMOTE_CODE asks to run a model repository's own Python: never here."""
    if os.environ.get("HF_TRUST_REMOTE_CODE", "").strip().lower() in ("1", "true", "yes"):
        raise PlatformError(
            "HF_TRUST_REMOTE_CODE is set: neuronserve never runs a model repository's own "
            "code (it serves the architectures transformers ships); unset it"
        )


def hugging_face_folder() -> Path | None:
    """The model data when its root is a Hugging Face model folder (config.json, no
    neuronserve artifact): compiled when the container starts, as an HF_MODEL_ID is. One
    with the toolkit's custom code (code/inference.py) is refused: its answers would be
    that code's, which is never run here."""
    try:
        source = model_source()
    except ModelSourceError:
        return None
    if not (source / "config.json").is_file() or (source / MANIFEST).is_file():
        return None
    if (source / "code" / "inference.py").is_file():
        raise PlatformError(
            f"{source}/code/inference.py: the Hugging Face toolkit's custom handler is "
            "never run here (neuronserve answers with the task's own pre- and "
            "post-processing); remove code/ from the model data, or serve it with the "
            "toolkit's container"
        )
    return source


def hub_token() -> None:
    """HF_API_TOKEN, the Hugging Face toolkit's older name of HF_TOKEN, where HF_TOKEN is
    not set (huggingface_hub reads HF_TOKEN)."""
    old = os.environ.get("HF_API_TOKEN", "").strip()
    if old and not os.environ.get("HF_TOKEN", "").strip():
        os.environ["HF_TOKEN"] = old


def sagemaker_deployment(spec: DeploySpec, work: Path) -> Deployment:
    """Find the model and make the deployment the front starts, its workers planned for
    this host from SageMaker's settings (once: the deployment packages and starts with
    this plan)."""
    if spec.model_sources():  # HF_MODEL_ID: compiled for this host, or from the cache
        spec = resolved(spec, log=log.info, progress=False)
        source: Path | None = None
        found = [
            FoundModel(e.artifact, e.name or e.artifact.name, e.truncation)
            for e in spec.model_entries()
        ]
    else:
        try:
            source = model_source(baked=not spec.multi_model.enabled)
        except ModelSourceError:
            if not spec.multi_model.enabled:
                raise
            source = None  # a multi-model endpoint starts empty
        found = find_models(source, work) if source is not None else []
    requested = spec.worker.workers
    # the plan is this host's: more workers than core groups are cut to the groups
    deployment = Deployment(spec, model_entries(found, spec), work, serving_host=True)
    plan = deployment.plan
    if requested and requested > plan.workers:
        log.warning(
            "SAGEMAKER_MODEL_SERVER_WORKERS=%s capped to %d: this host has %d %s core "
            "group(s) of %d core(s)",
            requested,
            plan.workers,
            plan.groups,
            plan.kind,
            plan.cores_per_worker,
        )
    if spec.multi_model.enabled:
        log.info("a multi-model endpoint, starting with %s", deployment.tasks)
    else:
        log.info("serving %s from %s", deployment.tasks, source)
    return deployment


def main() -> int:
    configure_logging()
    given = os.environ.get("NEURONSERVE_WORK_DIR")
    work = Path(given or tempfile.mkdtemp(prefix="ns-sm-"))
    try:
        try:
            on_sagemaker = platform() == "sagemaker"
            # NEURONSERVE_WORK_DIR holds the catalog and the workers' store: this user's
            private_dir(work)
            hub_token()
            spec = sagemaker_spec(work)
            config = FrontConfig.of(
                spec.front, spec.limits, spec.multi_model, sagemaker=on_sagemaker
            )
        except Exception as e:  # noqa: BLE001 - a bad setting must end the container, said why
            log.error("neuronserve: cannot start: %s", " | ".join(str(e).splitlines()))
            return 1
        return run(config, lambda: sagemaker_deployment(spec, work))
    finally:
        if not given:  # a folder of our own making goes with us (workers' logs, a .mar's)
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
