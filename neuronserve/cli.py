"""The `neuronserve` command: compile, package, serve.

Every command reads the same deployment spec (`--spec deploy.yaml`); flags given on
the command line override the file's fields.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from .spec import DeploySpec, SpecError, load_spec

app = typer.Typer(
    help="Compile Hugging Face encoders ahead of time and serve them behind TorchServe or "
         "Triton with one pinned worker per core group.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
package_app = typer.Typer(help="Package an artifact for a model server.", no_args_is_help=True)
serve_app = typer.Typer(help="Start (or stop) a model server on packaged models.",
                        no_args_is_help=True)
app.add_typer(package_app, name="package")
app.add_typer(serve_app, name="serve")

SpecOpt = Annotated[Path | None, typer.Option("--spec", help="deployment spec (YAML); "
                                              "flags override its fields")]


def _ints(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def _spec(path: Path | None, **overrides) -> DeploySpec:
    try:
        return load_spec(path, overrides)
    except SpecError as e:
        _fail(str(e))


def _fail(message: str, code: int = 2):
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@app.command()
def compile(
    spec: SpecOpt = None,
    model: Annotated[Path | None, typer.Option(help="local Hugging Face model directory")] = None,
    task: Annotated[str | None, typer.Option(
        help="feature-extraction | text-classification")] = None,
    target: Annotated[str | None, typer.Option(
        help="cpu | neuronx (Inf2/Trn1) | neuron (Inf1)")] = None,
    batch_sizes: Annotated[str | None, typer.Option(
        help="compiled batch sizes, e.g. 1,4,8")] = None,
    sequence_lengths: Annotated[str | None, typer.Option(
        help="compiled sequence lengths, e.g. 16,32,64,128")] = None,
    out: Annotated[Path | None, typer.Option(help="artifact directory to write")] = None,
    name: Annotated[str | None, typer.Option(help="model name (default: the out directory's)")]
    = None,
    pooling: Annotated[str | None, typer.Option(
        help="feature-extraction pooling: auto (sentence-transformers config, else cls), "
             "mean, cls")] = None,
    normalize: Annotated[bool | None, typer.Option(
        "--normalize/--no-normalize", help="L2-normalise embeddings (default: auto)")] = None,
    truncation: Annotated[bool | None, typer.Option(
        "--truncation/--no-truncation",
        help="truncate texts longer than the largest sequence length (default) or refuse them "
             "with a 413")] = None,
    tolerance: Annotated[float | None, typer.Option(
        help="largest accepted |compiled - eager| per bucket (fp32)")] = None,
    precision: Annotated[str | None, typer.Option(
        help="cpu: fp32 | bf16 | int8 | auto (default: the fastest that meets the accuracy "
             "floor; each candidate's accuracy is recorded in the manifest)")] = None,
    min_cosine: Annotated[float | None, typer.Option(
        help="feature-extraction accuracy floor: lowest cosine to fp32 eager (default 0.999)")]
    = None,
    min_argmax_agreement: Annotated[float | None, typer.Option(
        help="text-classification accuracy floor: share of texts whose top label matches fp32 "
             "eager (default 0.99)")] = None,
    auto_cast: Annotated[str | None, typer.Option(
        help="Neuron: none | matmult | all")] = None,
    auto_cast_type: Annotated[str | None, typer.Option(help="Neuron: bf16 | fp16 | tf32")] = None,
    optlevel: Annotated[int | None, typer.Option(help="neuronx-cc --optlevel 1-3")] = None,
    compiler_arg: Annotated[list[str] | None, typer.Option(
        help="extra compiler argument (repeat for several)")] = None,
    pipeline_cores: Annotated[str | None, typer.Option(
        help="Inf1 pipeline mode: NeuronCores per model, or auto (4*round(weights/2e7))")]
    = None,
    compile_for: Annotated[str | None, typer.Option(
        help="neuronx: compile for inf2 | trn1 | trn1n | trn2 on a build host")] = None,
    compiler_workdir: Annotated[Path | None, typer.Option(
        help="keep the compiler's intermediate files here (one folder per bucket)")] = None,
):
    """Compile a model for a target over a bucket grid, validating every bucket."""
    from .compile import CompileError, compile_model
    from .compile.driver import describe

    s = _spec(spec, model=model, task=task, target=target, batch_sizes=_ints(batch_sizes),
              sequence_lengths=_ints(sequence_lengths), artifact=out, name=name,
              pooling=pooling, normalize=normalize, truncation=truncation, tolerance=tolerance,
              precision=precision, min_cosine=min_cosine,
              min_argmax_agreement=min_argmax_agreement, auto_cast=auto_cast,
              auto_cast_type=auto_cast_type, optlevel=optlevel,
              compiler_args=compiler_arg,
              pipeline_cores=(int(pipeline_cores) if pipeline_cores and pipeline_cores.isdigit()
                              else pipeline_cores),
              compile_for=compile_for, compiler_workdir=compiler_workdir)
    try:
        path = compile_model(s)
    except (CompileError, ValueError, OSError) as e:
        _fail(str(e), 1)
    typer.echo(describe(path))
    typer.echo(f"artifact written to {path}")


def _serving_overrides(**kw):
    return {k: v for k, v in kw.items() if v is not None}


@package_app.command("torchserve")
def package_torchserve_cmd(
    artifact: Annotated[Path | None, typer.Argument(help="artifact directory from `compile`")]
    = None,
    spec: SpecOpt = None,
    model_store: Annotated[Path | None, typer.Option(help="TorchServe model store")] = None,
    name: Annotated[str | None, typer.Option(help="model name (default: the artifact's)")] = None,
    layout: Annotated[str | None, typer.Option(
        help="throughput (one single-core worker per core, default) | latency (one worker "
             "on every core)")] = None,
    workers: Annotated[int | None, typer.Option(help="workers (default: one per core group)")]
    = None,
    cores_per_worker: Annotated[int | None, typer.Option(help="cores leased by each worker")]
    = None,
    max_batch_delay_ms: Annotated[int | None, typer.Option(
        help="how long TorchServe waits to fill a batch")] = None,
    response_timeout_s: Annotated[int | None, typer.Option()] = None,
    archive_format: Annotated[str | None, typer.Option(help="default (.mar) or no-archive")]
    = None,
    token_auth: Annotated[bool | None, typer.Option(
        "--token-auth/--no-token-auth", help="TorchServe token authorization (default on)")]
    = None,
    truncation: Annotated[bool | None, typer.Option("--truncation/--no-truncation")] = None,
    inference_port: Annotated[int | None, typer.Option()] = None,
    management_port: Annotated[int | None, typer.Option()] = None,
    metrics_port: Annotated[int | None, typer.Option()] = None,
    neuron_cores: Annotated[int | None, typer.Option(
        help="NeuronCores of the serving host (default: discovered where workers start)")]
    = None,
):
    """Build <store>/<name>.mar with model-config.yaml, and the store's config.properties."""
    from .artifact import ArtifactError
    from .packaging.torchserve import PackagingError, package_torchserve

    s = _spec(spec, **_serving_overrides(
        artifact=artifact, model_store=model_store, name=name, layout=layout, workers=workers,
        cores_per_worker=cores_per_worker, max_batch_delay_ms=max_batch_delay_ms,
        response_timeout_s=response_timeout_s, archive_format=archive_format,
        token_auth=token_auth, truncation=truncation, inference_port=inference_port,
        management_port=management_port, metrics_port=metrics_port, neuron_cores=neuron_cores))
    if s.artifact is None:
        _fail("no artifact: pass the artifact directory or set `artifact` in the spec")
    try:
        out = package_torchserve(s.artifact, s)
    except (ArtifactError, PackagingError, OSError, RuntimeError) as e:
        _fail(str(e), 1)
    typer.echo(f"wrote {out}")
    typer.echo(f"wrote {out.parent / 'config.properties'}")


@serve_app.command("torchserve")
def serve_torchserve_cmd(
    spec: SpecOpt = None,
    model_store: Annotated[Path | None, typer.Option(help="model store to serve")] = None,
    run_dir: Annotated[Path | None, typer.Option(
        help="where TorchServe keeps its pid file, keys, logs and temp files")] = None,
    stop: Annotated[bool, typer.Option("--stop", help="stop the server started from run-dir "
                                                      "and wait until its processes exit")]
    = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait for every worker")] = 600,
    inference_port: Annotated[int | None, typer.Option()] = None,
    management_port: Annotated[int | None, typer.Option()] = None,
    metrics_port: Annotated[int | None, typer.Option()] = None,
):
    """Start TorchServe and return once every worker is READY (not when /ping says so)."""
    from .serve import torchserve as ts

    s = _spec(spec, **_serving_overrides(model_store=model_store, run_dir=run_dir,
                                         inference_port=inference_port,
                                         management_port=management_port,
                                         metrics_port=metrics_port))
    if stop:
        ts.stop(s.run_dir)
        return
    overrides = {}
    host = s.bind_address
    for flag, key, port in ((inference_port, "inference_address", s.inference_port),
                            (management_port, "management_address", s.management_port),
                            (metrics_port, "metrics_address", s.metrics_port)):
        if flag is not None or spec is not None:
            overrides[key] = f"http://{host}:{port}"
    try:
        inst = ts.start(s.model_store, s.run_dir, overrides, timeout_s=timeout)
    except ts.ServeError as e:
        _fail(str(e), 1)
    typer.echo("TorchServe is ready:")
    typer.echo(f"  inference   {inst.inference_url}/predictions/<model>")
    typer.echo(f"  management  {inst.management_url}/models")
    typer.echo(f"  metrics     {inst.metrics_url}/metrics")
    if inst.keys:
        typer.echo("  token authorization is on; send")
        typer.echo(f"    -H 'Authorization: Bearer {inst.keys.get('inference')}'  (inference)")
        typer.echo(f"    -H 'Authorization: Bearer {inst.keys.get('management')}'  (management)")
        typer.echo(f"  keys are in {inst.run_dir / 'key_file.json'}")
    typer.echo(f"  logs in {inst.log_dir}; stop with `neuronserve serve torchserve --stop"
               + (f" --run-dir {s.run_dir}`" if run_dir else "`"))


@package_app.command("triton")
def package_triton_cmd(
    artifact: Annotated[Path | None, typer.Argument(help="artifact directory from `compile`")]
    = None,
    spec: SpecOpt = None,
    repository: Annotated[Path | None, typer.Option(help="Triton model repository")] = None,
    name: Annotated[str | None, typer.Option(help="model name (default: the artifact's)")] = None,
    layout: Annotated[str | None, typer.Option(
        help="throughput (one single-core worker per core, default) | latency (one worker "
             "on every core)")] = None,
    instances: Annotated[int | None, typer.Option(
        help="model instances (default: one per core group)")] = None,
    cores_per_instance: Annotated[int | None, typer.Option(
        help="cores leased by each instance")] = None,
    max_batch_delay_ms: Annotated[int | None, typer.Option(
        help="dynamic batching queue delay")] = None,
    truncation: Annotated[bool | None, typer.Option("--truncation/--no-truncation")] = None,
    neuron_cores: Annotated[int | None, typer.Option(
        help="NeuronCores of the serving host (default: discovered where instances start)")]
    = None,
):
    """Write <repository>/<name>/{config.pbtxt, 1/model.py, 1/artifact/}."""
    from .artifact import ArtifactError
    from .packaging.triton import package_triton

    s = _spec(spec, **_serving_overrides(
        artifact=artifact, triton_repository=repository, name=name, layout=layout,
        workers=instances,
        cores_per_worker=cores_per_instance, max_batch_delay_ms=max_batch_delay_ms,
        truncation=truncation, neuron_cores=neuron_cores))
    if s.artifact is None:
        _fail("no artifact: pass the artifact directory or set `artifact` in the spec")
    try:
        out = package_triton(s.artifact, s)
    except (ArtifactError, OSError, RuntimeError) as e:
        _fail(str(e), 1)
    typer.echo(f"wrote {out}/config.pbtxt, {out}/1/model.py and {out}/1/artifact")


@serve_app.command("triton")
def serve_triton_cmd(
    spec: SpecOpt = None,
    repository: Annotated[Path | None, typer.Option(help="Triton model repository")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="where the server's pid file and "
                                                      "log are kept")] = None,
    stop: Annotated[bool, typer.Option("--stop", help="stop the server started from run-dir "
                                                      "and wait until its processes exit")]
    = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait for every model")] = 600,
    http_port: Annotated[int | None, typer.Option()] = None,
    grpc_port: Annotated[int | None, typer.Option()] = None,
    metrics_port: Annotated[int | None, typer.Option()] = None,
    sagemaker: Annotated[bool | None, typer.Option(
        "--sagemaker/--no-sagemaker",
        help="also serve SageMaker's GET /ping and POST /invocations")] = None,
    sagemaker_port: Annotated[int | None, typer.Option()] = None,
):
    """Start tritonserver and return once every model in the repository is READY."""
    from .serve import triton

    s = _spec(spec, **_serving_overrides(
        triton_repository=repository, triton_run_dir=run_dir, http_port=http_port,
        grpc_port=grpc_port, triton_metrics_port=metrics_port, sagemaker=sagemaker,
        sagemaker_port=sagemaker_port))
    if stop:
        triton.stop(s.triton_run_dir)
        return
    try:
        inst = triton.start(s.triton_repository, s.triton_run_dir, s.http_port, s.grpc_port,
                            s.triton_metrics_port,
                            s.sagemaker_port if s.sagemaker else None, timeout_s=timeout,
                            address=s.bind_address)
    except triton.ServeError as e:
        _fail(str(e), 1)
    typer.echo("tritonserver is ready:")
    typer.echo(f"  HTTP     {inst.http_url}/v2/models/<model>/infer")
    typer.echo(f"  gRPC     {inst.grpc_url}")
    typer.echo(f"  metrics  {inst.metrics_url}/metrics")
    if inst.sagemaker_url:
        typer.echo(f"  SageMaker  {inst.sagemaker_url}/ping, {inst.sagemaker_url}/invocations")
    typer.echo(f"  log in {inst.log}; stop with `neuronserve serve triton --stop"
               + (f" --run-dir {s.triton_run_dir}`" if run_dir else "`"))


@package_app.command("sagemaker")
def package_sagemaker_cmd(
    artifact: Annotated[Path | None, typer.Argument(help="artifact directory from `compile`")]
    = None,
    spec: SpecOpt = None,
    engine: Annotated[str, typer.Option(help="torchserve | triton")] = "torchserve",
    target: Annotated[str, typer.Option(help="cpu | neuronx | cuda (picks the Dockerfile)")]
    = "cpu",
    out: Annotated[Path, typer.Option(help="build context directory to write")] = Path("build"),
    name: Annotated[str | None, typer.Option(help="model name (default: the artifact's)")] = None,
):
    """Write a Docker build context for a SageMaker endpoint (Dockerfile, model, `serve`)."""
    from .artifact import ArtifactError
    from .packaging.sagemaker import ContextError, package_sagemaker

    s = _spec(spec, **_serving_overrides(artifact=artifact, name=name))
    if s.artifact is None:
        _fail("no artifact: pass the artifact directory or set `artifact` in the spec")
    try:
        path = package_sagemaker(s.artifact, s, engine, target, out)
    except (ArtifactError, ContextError, OSError, RuntimeError) as e:
        _fail(str(e), 1)
    typer.echo(f"wrote the build context {path}: docker build -t <image> {path}")


@serve_app.command("sagemaker")
def serve_sagemaker_cmd():
    """Run the SageMaker container entrypoint (what the image's `serve` runs): reads
    SAGEMAKER_BIND_TO_PORT, SAGEMAKER_MODEL_SERVER_WORKERS, SAGEMAKER_MODEL_SERVER_TIMEOUT
    and the model in /opt/ml/model (NEURONSERVE_MODEL_DIR) or baked into the image."""
    from .serve.sagemaker import main as sagemaker_main

    raise typer.Exit(sagemaker_main())


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


@app.command()
def bench(
    endpoint: Annotated[list[str], typer.Option(
        "--endpoint", "-e",
        help="what to measure, repeatable: torchserve:ARTIFACT, triton:ARTIFACT (HTTP and "
             "gRPC), sagemaker:ARTIFACT (servers started per layout, one at a time), "
             "runner:ARTIFACT, vanilla:MODEL_DIR (transformers pipeline baseline), or a "
             "running server: torchserve:http://HOST:PORT/predictions/MODEL, "
             "sagemaker:http://HOST:PORT/invocations, triton-http:HOST:PORT/MODEL, "
             "triton-grpc:HOST:PORT/MODEL. Prefix LABEL= to name it.")],
    sequence_lengths: Annotated[str, typer.Option(
        help="request lengths in tokens (exact, special tokens included)")] = "8,128",
    texts_per_request: Annotated[str, typer.Option(help="texts in each request")] = "1",
    concurrency: Annotated[str, typer.Option(help="concurrent clients (closed loop)")] = "1,4",
    layouts: Annotated[str, typer.Option(
        help="worker layouts for the servers bench starts: throughput, latency")]
    = "throughput",
    warmup: Annotated[float, typer.Option(help="seconds of warm-up before each point")] = 2.0,
    duration: Annotated[float, typer.Option(help="seconds measured per point (at least)")] = 5.0,
    min_requests: Annotated[int, typer.Option(help="requests measured per point (at least)")]
    = 20,
    max_duration: Annotated[float, typer.Option(
        help="stop a point after this many seconds even below --min-requests")] = 60.0,
    max_batch_delay_ms: Annotated[int | None, typer.Option(
        help="batching delay for the servers bench starts (default: the spec default)")]
    = None,
    batch_requests: Annotated[int | None, typer.Option(
        help="TorchServe batchSize for the servers bench starts (default: the spec default)")]
    = None,
    task: Annotated[str | None, typer.Option(
        help="pipeline task for vanilla (default: from an artifact among the endpoints)")]
    = None,
    tokenizer: Annotated[Path | None, typer.Option(
        help="tokenizer.json that counts request tokens (default: an endpoint's)")] = None,
    header: Annotated[list[str] | None, typer.Option(
        help="extra HTTP header 'Name: value' (e.g. TorchServe's token), repeatable")] = None,
    wrk: Annotated[bool, typer.Option(
        "--wrk/--no-wrk", help="cross-check one point with wrk (largest concurrency)")] = True,
    wrk_seq: Annotated[int | None, typer.Option(
        help="sequence length of the wrk cross-check (default: the shortest)")] = None,
    out: Annotated[Path, typer.Option(help="where results.{json,csv,md} and plots go")]
    = Path("bench-results"),
    title: Annotated[str, typer.Option(help="heading of results.md")] = "neuronserve bench",
):
    """Measure endpoints over sequence length x texts per request x concurrency:
    p50/p95/p99/max latency, throughput, ratio to the vanilla pipeline, the load
    generator's own CPU use; writes CSV, JSON, markdown and PNG plots."""
    from .bench.run import BenchConfig, parse_endpoint, run_bench, save

    headers = {}
    for h in header or []:
        name, sep, value = h.partition(":")
        if not sep:
            _fail(f"--header {h!r}: expected 'Name: value'")
        headers[name.strip()] = value.strip()
    bad = [x for x in layouts.split(",") if x not in ("throughput", "latency")]
    if bad:
        _fail(f"--layouts: unknown {bad}; use throughput and/or latency")
    try:
        config = BenchConfig(
            endpoints=[parse_endpoint(e) for e in endpoint],
            sequence_lengths=_ints(sequence_lengths), texts_per_request=_ints(texts_per_request),
            concurrency=_ints(concurrency), layouts=layouts.split(","), warmup_s=warmup,
            duration_s=duration, min_requests=min_requests, max_duration_s=max_duration,
            max_batch_delay_ms=max_batch_delay_ms, batch_requests=batch_requests,
            headers=headers, tokenizer=tokenizer,
            task=task, wrk=wrk, wrk_seq=wrk_seq)
        results = run_bench(config)
    except (ValueError, RuntimeError, OSError) as e:
        _fail(str(e), 1)
    paths = save(results, out, title)
    typer.echo((out / "results.md").read_text())
    typer.echo("wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
