"""neuronserve serve front | torchserve | triton | sagemaker: start (or stop) a server on
packaged models, returning only once every worker is ready."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import SpecFile, Stop, fail, load, spec_option
from .serve_front import front_cmd

app = typer.Typer(
    help="Start (or stop) a model server on packaged models.",
    rich_markup_mode="markdown",
    no_args_is_help=True,
)

Timeout = Annotated[float, typer.Option(help="seconds to wait for every worker to be ready")]

app.command("front")(front_cmd)


def _found(models: list[str], store: Path) -> None:
    """Name what a store the user packaged holds: all of it is served, models packaged
    there earlier included."""
    if models:
        typer.echo(f"serving {len(models)} model(s) found in {store}: {', '.join(models)}")


@app.command("torchserve")
def torchserve_cmd(
    spec: SpecFile = None,
    model_store: Annotated[Path | None, spec_option("model_store")] = None,
    run_dir: Annotated[Path | None, spec_option("run_dir")] = None,
    stop: Stop = False,
    timeout: Timeout = 600,
    inference_port: Annotated[int | None, spec_option("inference_port")] = None,
    management_port: Annotated[int | None, spec_option("management_port")] = None,
    metrics_port: Annotated[int | None, spec_option("metrics_port")] = None,
) -> None:
    """Start TorchServe and return once every worker is READY (not when /ping says so)."""
    from ..engines.torchserve import process as ts

    s = load(
        spec,
        model_store=model_store,
        run_dir=run_dir,
        inference_port=inference_port,
        management_port=management_port,
        metrics_port=metrics_port,
    )
    if stop:
        ts.stop(s.run_dir)
        return
    # ports given here (or in a spec) replace those packaging wrote into config.properties
    overrides = {}
    for flag, key, port in (
        (inference_port, "inference_address", s.inference_port),
        (management_port, "management_address", s.management_port),
        (metrics_port, "metrics_address", s.metrics_port),
    ):
        if flag is not None or spec is not None:
            overrides[key] = f"http://{s.bind_address}:{port}"
    _found(ts.models_in(s.model_store), s.model_store)
    try:
        inst = ts.start(s.model_store, s.run_dir, overrides, timeout_s=timeout)
    except ts.ServeError as e:
        fail(str(e), 1)
    typer.echo("TorchServe is ready:")
    typer.echo(f"  inference   {inst.inference_url}/predictions/<model>")
    typer.echo(f"  management  {inst.management_url}/models")
    typer.echo(f"  metrics     {inst.metrics_url}/metrics")
    if inst.keys:
        # the keys stay in their file: a terminal's scrollback and CI logs are not private
        keys = inst.run_dir / "key_file.json"
        typer.echo(
            f"  token authorization is on: send -H 'Authorization: Bearer <key>' with the\n"
            f"  inference key (or the management key) from {keys}"
        )
    typer.echo(
        f"  logs in {inst.log_dir}; stop with `neuronserve serve torchserve --stop"
        + (f" --run-dir {s.run_dir}`" if run_dir else "`")
    )


@app.command("triton")
def triton_cmd(
    spec: SpecFile = None,
    repository: Annotated[Path | None, spec_option("triton_repository", "--repository")] = None,
    run_dir: Annotated[Path | None, spec_option("triton_run_dir", "--run-dir")] = None,
    stop: Stop = False,
    timeout: Timeout = 600,
    http_port: Annotated[int | None, spec_option("http_port")] = None,
    grpc_port: Annotated[int | None, spec_option("grpc_port")] = None,
    metrics_port: Annotated[
        int | None, spec_option("triton_metrics_port", "--metrics-port")
    ] = None,
    sagemaker: Annotated[
        bool | None, spec_option("sagemaker", "--sagemaker/--no-sagemaker")
    ] = None,
) -> None:
    """Start tritonserver and return once every model in the repository is READY."""
    from ..engines.triton import process as triton

    s = load(
        spec,
        triton_repository=repository,
        triton_run_dir=run_dir,
        http_port=http_port,
        grpc_port=grpc_port,
        triton_metrics_port=metrics_port,
        sagemaker=sagemaker,
    )
    if stop:
        triton.stop(s.triton_run_dir)
        return
    if s.sagemaker:
        fail(
            "Triton's own SageMaker listener binds 0.0.0.0 with no authentication (tritonserver "
            "has no option to bind it elsewhere); serve /ping and /invocations through "
            "neuronserve's front instead: `neuronserve serve front REPOSITORY --engine triton`"
        )
    _found(triton.Triton.models_in(s.triton_repository), s.triton_repository)
    try:
        listen = triton.Listen(s.http_port, s.grpc_port, s.triton_metrics_port, s.bind_address)
        inst = triton.start(s.triton_repository, s.triton_run_dir, listen, timeout_s=timeout)
    except triton.ServeError as e:
        fail(str(e), 1)
    typer.echo("tritonserver is ready:")
    typer.echo(f"  HTTP     {inst.http_url}/v2/models/<model>/infer")
    typer.echo(f"  gRPC     {inst.grpc_url}")
    typer.echo(f"  metrics  {inst.metrics_url}/metrics")
    typer.echo(
        f"  healer   replaces an instance whose stub dies ({inst.run_dir / triton.HEALER_LOG}, "
        f"state in {inst.run_dir / triton.HEALER_STATUS_FILE})"
    )
    typer.echo(
        f"  log in {inst.log}; stop with `neuronserve serve triton --stop"
        + (f" --run-dir {s.triton_run_dir}`" if run_dir else "`")
    )


@app.command("sagemaker")
def sagemaker_cmd() -> None:
    """Run the SageMaker container entrypoint (what the image's `serve` runs): the front
    with SageMaker's settings, in this process. NEURONSERVE_PLATFORM says where it runs:
    sagemaker (SageMaker's contract: no API key, every address) or kubernetes (keys);
    unset, it refuses to start. Reads SAGEMAKER_BIND_TO_PORT,
    SAGEMAKER_MODEL_SERVER_WORKERS, SAGEMAKER_MODEL_SERVER_TIMEOUT and the model in
    /opt/ml/model (NEURONSERVE_MODEL_DIR) or baked into the image."""
    from ..serve.sagemaker import main as sagemaker_main

    raise typer.Exit(sagemaker_main())
