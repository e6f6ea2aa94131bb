"""neuronserve serve front | sagemaker: start (or stop) neuronserve's server on compiled
models, returning only once every worker is ready. `serve triton` and `serve torchserve`
are gone: those servers are started by their users on what `neuronserve package` writes,
and the commands say so."""

from __future__ import annotations

import typer

from ..spec import served_elsewhere
from .options import fail
from .serve_front import front_cmd

app = typer.Typer(
    help="Start (or stop) neuronserve's server: the front (OpenAI, text-embeddings-inference "
    "and SageMaker APIs) and one worker process per core group. To serve with Triton or "
    "TorchServe instead, package for them (`neuronserve package triton|torchserve`) and "
    "start their own server on what it writes.",
    rich_markup_mode="markdown",
    no_args_is_help=True,
)

app.command("front")(front_cmd)


def _refused(name: str) -> None:
    def served_by_its_own_server() -> None:
        fail(str(served_elsewhere(name)), 2)

    app.command(
        name,
        hidden=True,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(served_by_its_own_server)


for _name in ("triton", "torchserve"):
    _refused(_name)


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
