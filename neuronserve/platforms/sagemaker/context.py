"""package sagemaker: artifact -> a self-contained Docker build context.

    <out>/Dockerfile          for the target (base image as a build argument)
    <out>/serve               SageMaker's entrypoint (neuronserve.platforms.sagemaker.entrypoint)
    <out>/model/              the models, as the workers' store holds them
    <out>/python/neuronserve  this neuronserve
    <out>/requirements.txt    what neuronserve needs besides torch
    <out>/neuronserve.json    the target and the models' names

At run time `serve` prefers models SageMaker mounts in /opt/ml/model (an artifact,
several side by side, a .mar or a Triton repository), so one image can serve
other models than those it was built with.
"""

from __future__ import annotations

import json
import shutil
from importlib import metadata, resources
from pathlib import Path

from ...artifact import read_manifest
from ...packaging.model import prepare
from ...spec import DeploySpec
from ...workers.package import package_workers

TARGETS = ("cpu", "neuronx", "cuda")
# The artifact's compile target each image can run.
RUNS = {"cpu": {"cpu"}, "cuda": {"cpu"}, "neuronx": {"neuronx"}}


class ContextError(RuntimeError):
    pass


def _files() -> Path:
    return Path(str(resources.files("neuronserve.platforms.sagemaker.files")))


# of the cpu extra, what the images leave out (requirements)
IMAGE_LEAVES_OUT = {"nncf"}


def requirements(target: str) -> list[str]:
    """neuronserve's own requirements, without torch (the Dockerfile
    installs the build of torch its target needs); an image that runs CPU artifacts also
    gets the `cpu` extra: every CPU module format's runtime (ONNX Runtime, OpenVINO) and
    what compiling for the CPU needs (onnx, onnxscript), since `serve` may be handed
    another artifact than the one packaged, or a Hub id to compile at start. Not NNCF
    (and its scientific stack): a model compiled at start chooses among the other
    precisions; OpenVINO's int8 is compiled ahead of time."""
    from packaging.requirements import Requirement

    out = []
    for line in metadata.requires("neuronserve") or []:
        req = Requirement(line)
        wanted = req.marker is None or req.marker.evaluate({"extra": ""})
        if "cpu" in RUNS[target] and req.name not in IMAGE_LEAVES_OUT:
            wanted = wanted or bool(req.marker and req.marker.evaluate({"extra": "cpu"}))
        if wanted and req.name != "torch":
            req.marker = None
            out.append(str(req))
    return sorted(set(out))


def _copy_package(dst: Path) -> None:
    import neuronserve

    src = Path(neuronserve.__file__).parent
    # the adapters Triton and TorchServe load are for their servers, not this image's
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "_handlers", "_triton_backend")
    shutil.copytree(src, dst, ignore=skip)


def check_runs(spec: DeploySpec, target: str, what: str = "image") -> list[str]:
    """The names of the spec's models, once each is known to be compiled for what a
    `target` image (`what`: or pod) runs."""
    if target not in TARGETS:
        raise ContextError(f"target {target!r}: choose one of {', '.join(TARGETS)}")
    names = []
    for entry in spec.model_entries():
        manifest = read_manifest(entry.artifact)
        if manifest.target not in RUNS[target]:
            raise ContextError(
                f"{entry.artifact} was compiled for {manifest.target}; a {target} {what} "
                f"runs artifacts compiled for {', '.join(sorted(RUNS[target]))}"
            )
        names.append(entry.served_name(manifest.name))
    return names


def dockerfile(target: str) -> str:
    """The `target` image's Dockerfile."""
    return (_files() / f"Dockerfile.{target}").read_text()


def package_sagemaker(spec: DeploySpec, target: str, out: Path) -> Path:
    """The build context of an image serving the spec's models (one or several) on
    neuronserve's server."""
    names = check_runs(spec, target)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not (out / "neuronserve.json").is_file():
            raise ContextError(f"{out} exists and is not a neuronserve build context")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    files = _files()
    (out / "Dockerfile").write_text(dockerfile(target))
    shutil.copy2(files / "serve", out / "serve")
    (out / "serve").chmod(0o755)
    _copy_package(out / "python" / "neuronserve")
    (out / "requirements.txt").write_text("\n".join(requirements(target)) + "\n")

    # the workers' store, with the models' names and settings (`serve` reads it back and
    # plans its workers for the host it runs on: one is enough to build with)
    model_spec = spec.with_section("worker", workers=spec.worker.workers or 1)
    package_workers(out / "model", prepare(model_spec, "workers"))
    (out / "neuronserve.json").write_text(
        json.dumps({"target": target, "models": names}, indent=2) + "\n"
    )
    return out
