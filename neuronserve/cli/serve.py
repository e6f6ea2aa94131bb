"""neuronserve serve front | <engine> | sagemaker: start (or stop) a server on packaged
models, returning only once every worker is ready. One subcommand per engine of the
registry, its options from the engine's spec section."""

from __future__ import annotations

from pathlib import Path

import typer

from ..engines.base import engine_class
from ..registry import ENGINES
from ..spec import DeploySpec
from .options import Stop, Timeout, fail
from .serve_front import front_cmd
from .spec_options import spec_command

app = typer.Typer(
    help="Start (or stop) a model server on packaged models.",
    rich_markup_mode="markdown",
    no_args_is_help=True,
)

app.command("front")(front_cmd)


def _found(models: list[str], store: Path) -> None:
    """Name what a store the user packaged holds: all of it is served, models packaged
    there earlier included."""
    if models:
        typer.echo(f"serving {len(models)} model(s) found in {store}: {', '.join(models)}")


def _serve_command(name: str) -> None:
    kind = engine_class(name)

    @spec_command(name)
    def serve_engine(spec: DeploySpec, stop: Stop = False, timeout: Timeout = 600) -> None:
        from ..processes import ServeError

        section = spec.engine_named(name)
        engine = kind(section)
        if stop:
            engine.stop()
            return
        _found(kind.models_in(section.store), section.store)
        try:
            instance = engine.start(log=typer.echo, timeout_s=timeout)
        except ServeError as e:
            fail(str(e), 1)
        custom = "run_dir" in section.model_fields_set
        hint = f"`neuronserve serve {name} --stop" + (
            f" --run-dir {section.run_dir}`" if custom else "`"
        )
        for line in engine.ready_lines(instance, hint):
            typer.echo(line)

    serve_engine.__doc__ = (
        f"Start {kind.facts.server} on its store and return once every one of its "
        f"{kind.facts.worker_word} is ready (each holding its core group, every model loaded and "
        "warmed up); `--stop` stops it and waits until its processes are gone."
    )
    app.command(name)(serve_engine)


# an engine with no API of its own (the native one) is served behind the front only
for _name in ENGINES:
    if engine_class(_name).facts.protocols:
        _serve_command(_name)


@app.command("sagemaker")
def sagemaker_cmd() -> None:
    """Run the SageMaker container entrypoint (what the image's `serve` runs): the front
    with SageMaker's settings, in this process. NEURONSERVE_PLATFORM says where it runs:
    sagemaker (SageMaker's contract: no API key, every address) or kubernetes (keys);
    unset, it refuses to start. Reads SAGEMAKER_BIND_TO_PORT,
    SAGEMAKER_MODEL_SERVER_WORKERS, SAGEMAKER_MODEL_SERVER_TIMEOUT and the model in
    /opt/ml/model (NEURONSERVE_MODEL_DIR) or baked into the image."""
    from ..platforms.sagemaker.entrypoint import main as sagemaker_main

    raise typer.Exit(sagemaker_main())
