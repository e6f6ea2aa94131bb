"""package sagemaker: artifact -> a self-contained Docker build context.

    <out>/Dockerfile          for the target (base image as a build argument)
    <out>/serve               SageMaker's entrypoint (neuronserve.platforms.sagemaker.entrypoint)
    <out>/model/              the packaged model: a .mar store or a Triton repository
    <out>/python/neuronserve  this neuronserve, handler and Triton model.py included
    <out>/requirements.txt    what neuronserve and the engine need besides torch
    <out>/neuronserve.json    engine and target, read by `serve`

At run time `serve` prefers models SageMaker mounts in /opt/ml/model (a .mar, a Triton
repository, an artifact, or several artifacts side by side), so one image can serve
other models than those it was built with.
"""

from __future__ import annotations

import json
import shutil
from importlib import metadata, resources
from pathlib import Path

from ...artifact import read_manifest
from ...engines.base import engine_class
from ...packaging.model import prepare
from ...registry import ENGINES
from ...spec import DeploySpec

TARGETS = ("cpu", "neuronx", "cuda")
# The artifact's compile target each image can run.
RUNS = {"cpu": {"cpu"}, "cuda": {"cpu"}, "neuronx": {"neuronx"}}


class ContextError(RuntimeError):
    pass


def _files() -> Path:
    return Path(str(resources.files("neuronserve.platforms.sagemaker.files")))


def requirements(engine: str, target: str) -> list[str]:
    """neuronserve's own requirements plus the engine's, without torch (the Dockerfile
    installs the build of torch its target needs); an image that runs CPU artifacts also
    gets every library a CPU module format needs (ONNX Runtime, OpenVINO), since `serve`
    may be handed another artifact than the one packaged."""
    from packaging.requirements import Requirement

    from ...compile.cpu import RUNTIME_PACKAGES

    out = []
    for line in metadata.requires("neuronserve") or []:
        req = Requirement(line)
        wanted = req.marker is None or req.marker.evaluate(
            {"extra": engine_class(engine).facts.extra}
        )
        if "cpu" in RUNS[target] and req.name in RUNTIME_PACKAGES.values():
            wanted = wanted or bool(req.marker and req.marker.evaluate({"extra": "cpu"}))
        if wanted and req.name != "torch":
            req.marker = None
            out.append(str(req))
    return sorted(set(out))


def _copy_package(dst: Path) -> None:
    import neuronserve

    from ...engines.base import engine_class
    from ...registry import ENGINES
    from ...resources import package_file

    src = Path(neuronserve.__file__).parent
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # Editable installs map the engines' adapters from the repository: real copies here
    for adapter in (engine_class(e).facts.adapter for e in ENGINES):
        if adapter is None:
            continue
        package, name = adapter
        folder = dst / package.removeprefix("neuronserve.")
        folder.mkdir(exist_ok=True)
        (folder / "__init__.py").touch()
        shutil.copy2(package_file(package, name), folder / name)


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


# the line of each Dockerfile naming the system packages its engine needs (as written:
# TorchServe's); the context's Dockerfile names its own engine's
ENGINE_PACKAGES = 'ARG ENGINE_PACKAGES="openjdk-17-jre-headless"'


def dockerfile(target: str, engine: str) -> str:
    """The `target` image's Dockerfile, installing what `engine` needs from the system
    and nothing else (no Java runtime in a Triton image)."""
    text = (_files() / f"Dockerfile.{target}").read_text()
    assert ENGINE_PACKAGES in text, f"Dockerfile.{target} has no {ENGINE_PACKAGES}"
    wanted = " ".join(engine_class(engine).facts.system_packages)
    return text.replace(ENGINE_PACKAGES, f'ARG ENGINE_PACKAGES="{wanted}"')


def package_sagemaker(spec: DeploySpec, engine: str, target: str, out: Path) -> Path:
    """The build context of an image serving the spec's models (one or several) on
    `engine`."""
    if engine not in ENGINES:
        raise ContextError(f"engine {engine!r}: choose {' or '.join(ENGINES)}")
    names = check_runs(spec, target)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not (out / "neuronserve.json").is_file():
            raise ContextError(f"{out} exists and is not a neuronserve build context")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    files = _files()
    (out / "Dockerfile").write_text(dockerfile(target, engine))
    shutil.copy2(files / "serve", out / "serve")
    (out / "serve").chmod(0o755)
    _copy_package(out / "python" / "neuronserve")
    (out / "requirements.txt").write_text("\n".join(requirements(engine, target)) + "\n")

    # `serve` re-plans workers for the host it runs on; one is enough to build with.
    kind = engine_class(engine)
    # (the store is read back and packaged again at start: only its models count)
    model_spec = spec.with_section("worker", workers=spec.worker.workers or 1)
    section = model_spec.engine_named(engine).in_store(out / "model")
    kind(section).package(prepare(model_spec, kind.facts.worker_word))
    (out / "neuronserve.json").write_text(
        json.dumps({"engine": engine, "target": target, "models": names}, indent=2) + "\n"
    )
    return out
