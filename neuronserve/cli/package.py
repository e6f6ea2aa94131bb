"""neuronserve package torchserve | triton | sagemaker | kubernetes: artifacts (one, or
several served together) -> what an engine or a platform runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..spec import DeploySpec
from .options import (
    ArtifactsArg,
    CoresPerInstance,
    CoresPerWorker,
    DeploymentName,
    Instances,
    Layout,
    MaxBatchDelayMs,
    Name,
    NeuronCores,
    SpecFile,
    Truncation,
    Workers,
    artifacts_given,
    fail,
    load,
    require_artifacts,
    spec_option,
)

app = typer.Typer(
    help="Package an artifact for a model server or platform.",
    rich_markup_mode="markdown",
    no_args_is_help=True,
)


def _holding(spec: DeploySpec) -> str:
    """What a package of several models holds, and how a request names one."""
    entries = spec.model_entries()
    if len(entries) < 2:
        return ""
    return (
        f" ({len(entries)} models; a request names its model: TorchServe's "
        "X-Neuronserve-Model header, Triton's `model` request parameter)"
    )


@app.command("torchserve")
def torchserve_cmd(
    artifacts: ArtifactsArg = None,
    deployment_name: DeploymentName = None,
    spec: SpecFile = None,
    model_store: Annotated[Path | None, spec_option("model_store")] = None,
    name: Name = None,
    layout: Layout = None,
    workers: Workers = None,
    cores_per_worker: CoresPerWorker = None,
    max_batch_delay_ms: MaxBatchDelayMs = None,
    response_timeout_s: Annotated[int | None, spec_option("response_timeout_s")] = None,
    archive_format: Annotated[str | None, spec_option("archive_format")] = None,
    token_auth: Annotated[
        bool | None, spec_option("token_auth", "--token-auth/--no-token-auth")
    ] = None,
    truncation: Truncation = None,
    inference_port: Annotated[int | None, spec_option("inference_port")] = None,
    management_port: Annotated[int | None, spec_option("management_port")] = None,
    metrics_port: Annotated[int | None, spec_option("metrics_port")] = None,
    neuron_cores: NeuronCores = None,
) -> None:
    """Build <store>/<name>.mar with its model-config.yaml, and the store's
    config.properties."""
    from ..artifact import ArtifactError
    from ..engines.torchserve.package import PackagingError, package_torchserve

    s = load(
        spec,
        **artifacts_given(artifacts),
        deployment_name=deployment_name,
        model_store=model_store,
        name=name,
        layout=layout,
        workers=workers,
        cores_per_worker=cores_per_worker,
        max_batch_delay_ms=max_batch_delay_ms,
        response_timeout_s=response_timeout_s,
        archive_format=archive_format,
        token_auth=token_auth,
        truncation=truncation,
        inference_port=inference_port,
        management_port=management_port,
        metrics_port=metrics_port,
        neuron_cores=neuron_cores,
    )
    try:
        out = package_torchserve(require_artifacts(s))
    except (ArtifactError, PackagingError, OSError) as e:
        fail(str(e), 1)
    typer.echo(f"wrote {out}{_holding(s)}")
    typer.echo(f"wrote {out.parent / 'config.properties'}")


@app.command("triton")
def triton_cmd(
    artifacts: ArtifactsArg = None,
    deployment_name: DeploymentName = None,
    spec: SpecFile = None,
    repository: Annotated[Path | None, spec_option("triton_repository", "--repository")] = None,
    name: Name = None,
    layout: Layout = None,
    instances: Instances = None,
    cores_per_instance: CoresPerInstance = None,
    max_batch_delay_ms: MaxBatchDelayMs = None,
    truncation: Truncation = None,
    neuron_cores: NeuronCores = None,
) -> None:
    """Write <repository>/<name>/{config.pbtxt, 1/model.py, 1/artifact/}."""
    from ..artifact import ArtifactError
    from ..engines.triton.package import package_triton
    from ..packaging.model import PackagingError

    s = load(
        spec,
        **artifacts_given(artifacts),
        deployment_name=deployment_name,
        triton_repository=repository,
        name=name,
        layout=layout,
        workers=instances,
        cores_per_worker=cores_per_instance,
        max_batch_delay_ms=max_batch_delay_ms,
        truncation=truncation,
        neuron_cores=neuron_cores,
    )
    try:
        out = package_triton(require_artifacts(s))
    except (ArtifactError, PackagingError, OSError) as e:
        fail(str(e), 1)
    typer.echo(f"wrote {out}/config.pbtxt, {out}/1/model.py and {out}/1/models{_holding(s)}")


@app.command("sagemaker")
def sagemaker_cmd(
    artifacts: ArtifactsArg = None,
    deployment_name: DeploymentName = None,
    spec: SpecFile = None,
    engine: Annotated[
        str, typer.Option(help="the engine inside the image: torchserve | triton")
    ] = "torchserve",
    target: Annotated[
        str,
        typer.Option(help="the image's hardware, which picks the Dockerfile: cpu | neuronx | cuda"),
    ] = "cpu",
    out: Annotated[Path, typer.Option(help="build context directory to write")] = Path("build"),
    name: Name = None,
    truncation: Truncation = None,
) -> None:
    """Write a Docker build context for a SageMaker endpoint (Dockerfile, model, `serve`)."""
    from ..artifact import ArtifactError
    from ..packaging.model import PackagingError
    from ..packaging.sagemaker import ContextError, package_sagemaker

    s = load(
        spec,
        **artifacts_given(artifacts),
        deployment_name=deployment_name,
        name=name,
        truncation=truncation,
    )
    try:
        path = package_sagemaker(require_artifacts(s), engine, target, out)
    except (ArtifactError, ContextError, PackagingError, OSError) as e:
        fail(str(e), 1)
    typer.echo(f"wrote the build context {path}: docker build -t <image> {path}")


@app.command("kubernetes")
def kubernetes_cmd(
    artifacts: ArtifactsArg = None,
    deployment_name: DeploymentName = None,
    spec: SpecFile = None,
    image: Annotated[
        str,
        typer.Option(
            help="the image the pods run, as your registry names it once you have built "
            "<out>/image and pushed it (e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/"
            "minilm:neuronx)"
        ),
    ] = "",
    engine: Annotated[
        str, typer.Option(help="the engine inside the image: torchserve | triton")
    ] = "torchserve",
    target: Annotated[
        str, typer.Option(help="the pods' hardware: cpu | neuronx (aws.amazon.com/neuroncore)")
    ] = "cpu",
    out: Annotated[Path, typer.Option(help="folder to write")] = Path("kubernetes"),
    namespace: Annotated[str, typer.Option(help="namespace of every object")] = "default",
    cores: Annotated[
        int | None,
        typer.Option(
            help="NeuronCores (neuronx) or CPUs (cpu) per pod [default: 2 NeuronCores, one "
            "inf2 device; 2 workers' worth of CPUs]; the pod plans its workers from what it "
            "is granted"
        ),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(help="memory per pod [default: from the artifact's size and workers]"),
    ] = None,
    min_replicas: Annotated[int, typer.Option(help="fewest pods")] = 1,
    max_replicas: Annotated[int, typer.Option(help="most pods the autoscaler starts")] = 4,
    in_flight_target: Annotated[
        int | None,
        typer.Option(
            help="requests in flight per pod the autoscaler aims at [default: 8 per worker]"
        ),
    ] = None,
    model_claim: Annotated[
        str | None,
        typer.Option(
            help="PersistentVolumeClaim holding the model (an artifact, .mar store or Triton "
            "repository) to mount at /mnt/models instead of the model baked into the image"
        ),
    ] = None,
    api_key_secret: Annotated[
        str | None,
        typer.Option(help="Secret with the API key under `api-key` [default: <name>-api-key]"),
    ] = None,
    scheduler: Annotated[
        str | None,
        typer.Option(
            help="schedulerName of the pods [default: my-scheduler, the Neuron scheduler "
            "extension's, for neuronx pods of more than one core; '' for the default]"
        ),
    ] = None,
    name: Name = None,
    cores_per_worker: CoresPerWorker = None,
    truncation: Truncation = None,
) -> None:
    """Write the image's build context and Kubernetes manifests: plain (Deployment,
    Service, HorizontalPodAutoscaler, PodDisruptionBudget) and KServe (ServingRuntime,
    InferenceService)."""
    # long: typer declares one parameter per command-line option
    from ..artifact import ArtifactError
    from ..packaging.kubernetes import ClusterOptions, package_kubernetes
    from ..packaging.model import PackagingError
    from ..packaging.sagemaker import ContextError

    if not image:
        fail("--image is required: where your registry will hold the image built from "
             "<out>/image", 2)  # fmt: skip
    s = load(
        spec,
        **artifacts_given(artifacts),
        deployment_name=deployment_name,
        name=name,
        truncation=truncation,
        cores_per_worker=cores_per_worker,
    )
    options = ClusterOptions(
        image=image,
        namespace=namespace,
        cores=cores,
        memory=memory,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        in_flight_target=in_flight_target,
        model_claim=model_claim,
        api_key_secret=api_key_secret,
        scheduler=scheduler,
    )
    try:
        pod = package_kubernetes(require_artifacts(s), engine, target, out, options)
    except (ArtifactError, ContextError, PackagingError, OSError) as e:
        fail(str(e), 1)
    unit = "NeuronCore(s)" if target == "neuronx" else "CPU(s)"
    typer.echo(
        f"wrote {out}/image (build context), {out}/plain, {out}/kserve and "
        f"{out}/prometheus-adapter.yaml\n"
        f"  pods: {pod.cores} {unit} and {pod.memory} each, {pod.workers} worker(s) of "
        f"{pod.cores_per_worker} planned at start; autoscale {options.min_replicas}.."
        f"{options.max_replicas} pods at {pod.in_flight_target} requests in flight per pod\n"
        f"next:\n"
        f"  docker build -t {image} {out}/image && docker push {image}\n"
        f"  kubectl -n {namespace} create secret generic {pod.secret} "
        '--from-literal=api-key="$(python3 -c '
        "'import secrets; print(secrets.token_urlsafe(32))')\"\n"
        f"  kubectl apply -f {out}/plain        # or: kubectl apply -f {out}/kserve"
    )
