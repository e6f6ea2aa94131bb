"""neuronserve serve front: the HTTP front (OpenAI, text-embeddings-inference and SageMaker
routes, keys, limits, TLS) in front of TorchServe or Triton, which it starts on loopback."""

from __future__ import annotations

import json
import ssl
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer

from ..spec import DeploySpec
from .options import Stop, Timeout, fail
from .spec_options import TOP, spec_command

Sources = Annotated[
    list[Path] | None,
    typer.Argument(
        help="what to serve: artifact directories (one, or several served together by the "
        "same workers), or what `neuronserve package` wrote (a model store holding a .mar, "
        "a Triton repository): its models are served here (default: the spec's `artifact` "
        "or `models`)",
        show_default=False,
    ),
]

# the routes each task adds to the ones every model has
RERANK_ROUTES = ["POST /rerank", "POST /v2/rerank (Cohere)", "POST /v1/rerank (Cohere v1, Jina)"]
TASK_ROUTES = {
    "feature-extraction": ["POST /v1/embeddings (OpenAI)", "POST /embed"],
    "text-classification": [
        "POST /predict",
        *(f"{r}, for one-label cross-encoders" for r in RERANK_ROUTES),
    ],
    "rerank": RERANK_ROUTES,
}


HubModels = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        help="a model to serve by Hugging Face Hub id (org/name, org/name@revision) or "
        "folder, repeatable: downloaded (HF_TOKEN, HF_HOME, HF_HUB_OFFLINE apply), compiled "
        "for this host with the compile options below (task from its config unless --task) "
        "and kept in the artifact cache (NEURONSERVE_CACHE, default ~/.cache/neuronserve), "
        "so the next start reuses it",
        show_default=False,
    ),
]


@spec_command(
    TOP,
    "front",
    "worker",
    "limits",
    "multi_model",
    "compile",
    "accuracy",
    skip=("artifact", "model"),
)
def front_cmd(
    spec: DeploySpec,
    sources: Sources = None,
    models: HubModels = None,
    stop: Stop = False,
    foreground: Annotated[
        bool,
        typer.Option(
            "--foreground",
            help="run in this process until SIGTERM or Ctrl-C (containers), instead of "
            "returning once ready",
        ),
    ] = False,
    timeout: Timeout = 600,
) -> None:
    """Start the front and its workers; return once every worker is ready.

    From a model id to an endpoint: `neuronserve serve front --model
    sentence-transformers/all-MiniLM-L6-v2` downloads, compiles for this host and serves
    (the second start reuses the compiled artifact). Artifacts `neuronserve compile`
    wrote, or stores `neuronserve package` wrote, are served as they are.

    The front answers OpenAI's `POST /v1/embeddings`; text-embeddings-inference's `POST /`
    (the model's own task), `/embed`, `/embed_all`, `/embed_sparse`, `/similarity`,
    `/predict`, `/rerank`, `/tokenize`, `/decode`, `/info`, `/health`; SageMaker's `/ping`
    and `/invocations`; `/metrics` and `/docs`. Each worker process owns a core group and
    listens on a socket in a private folder only. API keys are required whenever the
    front listens beyond loopback.
    """
    from ..processes import ServeError
    from ..serve.front import launch
    from ..serve.front.keys import KeyFileError

    s = spec
    if stop:
        launch.stop(s.front.run_dir)
        return
    if not foreground:
        try:
            launch.refuse_second(s.front.run_dir)
        except ServeError as e:
            fail(str(e), 1)
    s, given = _what_to_serve(s, list(sources or []), models or [])
    try:
        if foreground:
            raise typer.Exit(_foreground(s, given))
        inst = launch.start(s, given, timeout_s=timeout, log=typer.echo)
    except (ServeError, KeyFileError) as e:
        fail(str(e), 1)
    _report(inst, "run_dir" in s.front.model_fields_set)


def _what_to_serve(
    spec: DeploySpec, sources: list[Path], models: list[str]
) -> tuple[DeploySpec, list[Path]]:
    """The spec and the sources to start with: the command line's sources and models
    (models by Hub id or folder compiled, or found in the artifact cache) in place of the
    spec's, else the spec's; a missing source or nothing to serve fails here, before
    anything starts."""
    given = list(sources or ([spec.artifact] if spec.artifact is not None else []))
    if models:  # the command line's models replace the spec's
        spec = _named_models(spec, models)
        given = list(sources)
    for source in given:
        if not Path(source).is_dir():
            fail(
                f"{source} does not exist or is not a folder: pass an artifact, a model store "
                f"or a Triton repository, or serve a Hub id or model folder with --model "
                f"{source}",
                1,
            )
    wanted = given or spec.models or spec.model_sources() or spec.multi_model.enabled
    if not wanted:
        fail(
            "nothing to serve: pass --model (a Hugging Face Hub id or a model folder), an "
            "artifact (or several), a model store or a Triton repository"
        )
    spec = _compiled(spec)
    if models and given:  # artifacts and models by id on one command line: all served
        given += [e.artifact for e in spec.model_entries()]
    if given and (spec.artifact is not None or spec.models):
        # the command line's sources replace the spec's
        spec = spec.model_copy(update={"artifact": None, "models": []})
    return spec, given


def _named_models(spec: DeploySpec, models: list[str]) -> DeploySpec:
    from ..spec import ModelSource

    one = len(models) == 1
    sources = [
        ModelSource(
            model=m,
            revision=spec.compile.revision if one else None,
            name=spec.name if one else None,
            truncation=spec.truncation,
        )
        for m in models
    ]
    return spec.with_models(sources)


def _compiled(spec: DeploySpec) -> DeploySpec:
    """The spec with its models named by Hub id or folder compiled (or found in the
    artifact cache), each step said as it happens."""
    if not spec.model_sources():
        return spec
    from ..compile import CompileError
    from ..compile.cache import resolved

    try:
        return resolved(spec, log=typer.echo)
    except (CompileError, ValueError, OSError) as e:
        fail(str(e), 1)


def _foreground(spec: Any, sources: list[Path]) -> int:
    from ..serve.deployment import deployment_for
    from ..serve.front.config import FrontConfig
    from ..serve.front.launch import WORKERS_DIR
    from ..serve.front.server import configure_logging, run

    configure_logging()
    config = FrontConfig.of(spec.front, spec.limits, spec.multi_model)
    return run(config, lambda: deployment_for(spec, sources, config.run_dir / WORKERS_DIR))


def _report_multi_model(config: Any, info: dict[str, Any], log_file: Path) -> None:
    typer.echo(
        f"neuronserve front is ready at {config.url}: multi-model, "
        f"{len(info.get('models', []))} model(s) loaded"
    )
    for m in info.get("models", []):
        typer.echo(f"  {m['model_id']}: {m.get('task', '?')}, {m.get('state', '?')}")
    where = f"admin key in {config.admin_keys.where}" if config.admin_keys else "no key"
    typer.echo(
        "  POST /models {model_name, url} loads one, GET /models lists them, "
        f"DELETE /models/<name> unloads, PUT /models/<name> swaps ({where})"
    )
    typer.echo(
        "  POST /models/<name>/invoke, any route naming the model, or the model's base URL "
        "/models/<name> (every text-embeddings-inference and OpenAI route under it)"
    )
    typer.echo(f"  log in {log_file}")


def _report(inst: Any, custom_run_dir: bool) -> None:
    config = inst.config
    headers = {"Authorization": f"Bearer {config.keys.values[0].decode()}"} if config.keys else {}
    context = ssl._create_unverified_context() if config.tls_cert else None
    request = urllib.request.Request(f"{config.url}/info", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as r:
            info = json.loads(r.read())
    except (OSError, ValueError) as e:  # it is running: say so, and where to look
        typer.echo(f"neuronserve front is ready at {config.url} (its /info failed: {e})")
        info = {"model_id": "?", "task": "?", "target": "?", "precision": "?"}
    models = info.get("models") or [info]
    if config.multi_model:
        _report_multi_model(config, info, inst.log)
        return
    if len(models) == 1:
        typer.echo(
            f"neuronserve front is ready at {config.url}: {info['model_id']} ({info['task']}, "
            f"{info['target']} {info['precision']}) on {inst.workers} worker(s)"
        )
    else:
        typer.echo(
            f"neuronserve front is ready at {config.url}: {len(models)} models on "
            f"{inst.workers} worker(s), each holding them all"
        )
        for m in models:
            typer.echo(
                f"  {m['model_id']}: {m['task']}, {m['target']} {m['precision']}, base URL "
                f"{config.url}{m.get('base_url', '')}"
            )
        typer.echo(
            "  name a model in the request (OpenAI's and the other routes' \"model\" field), "
            f"or use its base URL; the root's default: {info['model_id']}"
        )
    tasks = list(dict.fromkeys(m["task"] for m in models))
    routes = [r for t in tasks for r in TASK_ROUTES.get(t, [])]
    for route in [*dict.fromkeys(routes), "POST /invocations (SageMaker)"]:
        typer.echo(f"  {route}")
    typer.echo("  POST /tokenize, GET /info, /health, /metrics, /docs")
    if config.keys:
        typer.echo(
            f"  API key required: send `Authorization: Bearer <key>`, key in {config.keys.where}"
        )
    else:
        typer.echo("  no API key needed: the front listens on loopback only")
    stop = "`neuronserve serve front --stop" + (
        f" --run-dir {config.run_dir}`" if custom_run_dir else "`"
    )
    typer.echo(f"  log in {inst.log}; stop with {stop}")
