"""neuronserve package triton | torchserve | sagemaker | kubernetes: artifacts -> what a
server or platform loads: a Triton model repository and a TorchServe model store that
their own servers run, an image's build context for neuronserve's server, manifests that
run that image. Options from the spec's worker and limits sections and the packager's
own."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..spec import DeploySpec, ModelEntry, served_elsewhere
from .options import ArtifactsArg, fail
from .spec_options import TOP, spec_command

app = typer.Typer(
    help="Package an artifact for a model server or platform.",
    rich_markup_mode="markdown",
    no_args_is_help=True,
)

# an image runs neuronserve's server only; --engine is kept to say what to do instead
EngineOption = Annotated[str | None, typer.Option(hidden=True)]


def with_artifacts(spec: DeploySpec, artifacts: list[Path] | None) -> DeploySpec:
    """`spec` with the artifacts given on the command line in place of its own: one is
    the spec's `artifact` (under the spec's `name`), several its `models`."""
    if not artifacts:
        return spec
    name = spec.name if len(artifacts) == 1 else None
    try:
        return spec.with_models([ModelEntry(artifact=a, name=name) for a in artifacts])
    except ValueError as e:
        fail(str(e))


def require_artifacts(spec: DeploySpec, target: str | None = None) -> DeploySpec:
    """`spec` with artifacts for every model it deploys: those it names by Hub id or
    folder (`models: [{model: ...}]`) compiled first, for `target` (the package's) unless
    the compile section names one, else this host's; fails when it names none."""
    if spec.model_sources():
        from ..compile import CompileError
        from ..compile.cache import resolved

        try:
            spec = resolved(spec, log=typer.echo, target=target)
        except (CompileError, ValueError, OSError) as e:
            fail(str(e), 1)
    if not spec.model_entries():
        fail(
            "no artifact: pass the artifact directory (or several), or set `artifact` "
            "(or `models`) in the spec"
        )
    return spec


def _holding(spec: DeploySpec, named_by: str) -> str:
    """What a package of several models holds, and how a request names one."""
    entries = spec.model_entries()
    if len(entries) < 2:
        return ""
    return f" ({len(entries)} models; a request names its model: {named_by})"


def _refuse_engine(engine: str | None) -> None:
    refusal = served_elsewhere(engine)
    if refusal:
        fail(f"{refusal} (an image runs neuronserve's own server)", 2)


@app.command("triton")
@spec_command(TOP, "worker", "limits", "triton", skip=("artifact",))
def triton_cmd(spec: DeploySpec, artifacts: ArtifactsArg = None) -> None:
    """Write a Triton model repository (`config.pbtxt` and the Python backend's
    `model.py`, the artifacts inside) holding the artifacts as one Triton model: one
    instance per core group, each holding every model. Serve it with `tritonserver
    --model-repository REPO` (NVIDIA's container, or the nvidia-pytriton wheel's server)."""
    from ..artifact import ArtifactError
    from ..packaging.model import PackagingError, prepare
    from ..packaging.triton import package_triton

    s = require_artifacts(with_artifacts(spec, artifacts))
    try:
        out = package_triton(s.triton, prepare(s, "instances"))
    except (ArtifactError, PackagingError, OSError) as e:
        fail(str(e), 1)
    typer.echo(
        f"wrote {out}" + _holding(s, "the `model` request parameter (Triton's parameters field)")
    )
    typer.echo(f"  serve it: tritonserver --model-repository {out.parent}")


@app.command("torchserve")
@spec_command(TOP, "worker", "limits", "torchserve", skip=("artifact",))
def torchserve_cmd(spec: DeploySpec, artifacts: ArtifactsArg = None) -> None:
    """Write a TorchServe model store (a .mar holding the handler and the artifacts, and
    the store's config.properties) holding the artifacts as one TorchServe model: one
    worker per core group, each holding every model. Serve it with `torchserve --start
    --model-store STORE --ts-config STORE/config.properties`."""
    from ..artifact import ArtifactError
    from ..packaging.model import PackagingError, prepare
    from ..packaging.torchserve import CONFIG_FILE, package_torchserve

    s = require_artifacts(with_artifacts(spec, artifacts))
    try:
        out = package_torchserve(s.torchserve, prepare(s, "workers"))
    except (ArtifactError, PackagingError, OSError) as e:
        fail(str(e), 1)
    store = out.parent
    typer.echo(f"wrote {out}" + _holding(s, "the X-Neuronserve-Model header"))
    typer.echo(f"wrote {store / CONFIG_FILE}")
    typer.echo(
        f"  serve it: torchserve --start --model-store {store} --ts-config {store / CONFIG_FILE}"
    )


@app.command("sagemaker")
@spec_command(TOP, skip=("artifact",))
def sagemaker_cmd(
    spec: DeploySpec,
    artifacts: ArtifactsArg = None,
    engine: EngineOption = None,
    target: Annotated[
        str,
        typer.Option(help="the image's hardware, which picks the Dockerfile: cpu | neuronx | cuda"),
    ] = "cpu",
    out: Annotated[Path, typer.Option(help="build context directory to write")] = Path("build"),
) -> None:
    """Write a Docker build context for a SageMaker endpoint (Dockerfile, model, `serve`)."""
    from ..artifact import ArtifactError
    from ..packaging.model import PackagingError
    from ..platforms.sagemaker.context import ContextError, package_sagemaker

    _refuse_engine(engine)
    s = with_artifacts(spec, artifacts)
    try:
        path = package_sagemaker(require_artifacts(s, target), target, out)
    except (ArtifactError, ContextError, PackagingError, OSError) as e:
        fail(str(e), 1)
    typer.echo(f"wrote the build context {path}: docker build -t <image> {path}")


@app.command("kubernetes")
@spec_command(TOP, "worker", skip=("artifact",))
def kubernetes_cmd(
    spec: DeploySpec,
    artifacts: ArtifactsArg = None,
    image: Annotated[
        str,
        typer.Option(
            help="the image the pods run, as your registry names it once you have built "
            "<out>/image and pushed it (e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/"
            "minilm:neuronx)"
        ),
    ] = "",
    engine: EngineOption = None,
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
    store_uri: Annotated[
        str,
        typer.Option(
            help="where you keep what `package triton` and `package torchserve` wrote, for "
            "KServe's own Triton and TorchServe runtimes (URI/triton: the repository; "
            "URI/torchserve: config/config.properties and model-store/)"
        ),
    ] = "s3://YOUR-BUCKET/neuronserve",
) -> None:
    """Write the image's build context and Kubernetes manifests: plain (Deployment,
    Service, HorizontalPodAutoscaler, PodDisruptionBudget) and KServe (ServingRuntime,
    InferenceService) for neuronserve's server, and InferenceServices for KServe's own
    Triton and TorchServe runtimes serving what `package triton|torchserve` wrote."""
    # long: typer declares one parameter per command-line option
    from ..artifact import ArtifactError
    from ..packaging.model import PackagingError
    from ..platforms.kubernetes import ClusterOptions, package_kubernetes
    from ..platforms.sagemaker.context import ContextError

    _refuse_engine(engine)
    if not image:
        fail("--image is required: where your registry will hold the image built from "
             "<out>/image", 2)  # fmt: skip
    s = with_artifacts(spec, artifacts)
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
        store_uri=store_uri,
    )
    try:
        pod = package_kubernetes(require_artifacts(s, target), target, out, options)
    except (ArtifactError, ContextError, PackagingError, OSError) as e:
        fail(str(e), 1)
    unit = "NeuronCore(s)" if target == "neuronx" else "CPU(s)"
    typer.echo(
        f"wrote {out}/image (build context), {out}/plain, {out}/kserve, "
        f"{out}/kserve-triton, {out}/kserve-torchserve and {out}/prometheus-adapter.yaml\n"
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
