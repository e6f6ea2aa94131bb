"""The SageMaker CPU image, built from `neuronserve package sagemaker` and run as SageMaker
runs it: `docker run IMAGE serve`, the model data unpacked read-only at /opt/ml/model
(or the models of a multi-model endpoint under /opt/ml/models), port 8080, the memory and
CPUs of a small instance, and only the environment a SageMaker model sets."""

from __future__ import annotations

import json
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from helpers import HUB_TEST_ID, SENTENCES, hub_cache, reference_embeddings
from images import docker

# an ml.c5.large's memory and CPUs (2 vCPUs, 4 GiB)
LIMITS = ["--memory", "4g", "--cpus", "2"]
# what a SageMaker model's Environment says for our image
SAGEMAKER_ENV = ["-e", "NEURONSERVE_PLATFORM=sagemaker"]
# SageMaker waits for /ping up to its container startup health check timeout
READY_S = 300


class Container:
    """One `docker run -d` of the image, its port 8080 published on this host."""

    def __init__(self, image: str, *args: str):
        self.id = docker("run", "-d", "-p", "127.0.0.1::8080", *LIMITS, *SAGEMAKER_ENV,
                         *args, image, "serve").stdout.strip()  # fmt: skip
        port = docker("port", self.id, "8080/tcp").stdout.split()[0].rsplit(":", 1)[1]
        self.url = f"http://127.0.0.1:{port}"
        self.pings: list[int] = []

    def running(self) -> bool:
        state = docker("inspect", "-f", "{{.State.Running}}", self.id, check=False).stdout
        return state.strip() == "true"

    def logs(self) -> str:
        done = docker("logs", self.id, check=False)
        return (done.stdout + done.stderr)[-6000:]

    def ready(self) -> None:
        """Poll /ping as SageMaker does; the first 200 must be a server that answers."""
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            assert self.running(), self.logs()
            try:
                status = requests.get(f"{self.url}/ping", timeout=5).status_code
            except (requests.ConnectionError, requests.Timeout):
                status = 0  # not up, or busy starting: SageMaker asks again
            self.pings.append(status)
            if status == 200:
                return
            time.sleep(0.2)
        pytest.fail(f"/ping never 200 in {READY_S} s: {self.logs()}")

    def stop(self) -> tuple[int, float]:
        """`docker stop` (SIGTERM, SIGKILL after 10 s): its exit code and how long it took."""
        started = time.monotonic()
        docker("stop", self.id)
        took = time.monotonic() - started
        code = int(docker("inspect", "-f", "{{.State.ExitCode}}", self.id).stdout)
        return code, took

    def remove(self) -> None:
        docker("rm", "-f", self.id, check=False)


@pytest.fixture
def run(cpu_image: str) -> Iterator:
    started: list[Container] = []

    def start(*args: str) -> Container:
        started.append(Container(cpu_image, *args))
        return started[-1]

    yield start
    for c in started:
        c.remove()


def _embed(url: str, texts: list[str]) -> np.ndarray:
    r = requests.post(f"{url}/invocations", json={"inputs": texts}, timeout=60)
    assert r.status_code == 200, r.text
    return np.asarray(r.json(), dtype=np.float32)


def test_single_model_as_sagemaker_runs_it(run, minilm_artifact, minilm_dir):
    c = run("-v", f"{minilm_artifact}:/opt/ml/model:ro")
    c.ready()
    # the first 200 of /ping is a server that answers at once, correctly
    want = reference_embeddings(minilm_dir, SENTENCES)
    assert np.allclose(_embed(c.url, SENTENCES), want, atol=1e-4)
    one = requests.post(
        f"{c.url}/invocations", data=SENTENCES[0], headers={"Content-Type": "text/plain"},
        timeout=60,
    )  # fmt: skip
    assert one.status_code == 200, one.text
    assert np.allclose(np.asarray(one.json(), dtype=np.float32).reshape(-1), want[0], atol=1e-4)
    bad = requests.post(
        f"{c.url}/invocations", data=b"{not json", headers={"Content-Type": "application/json"},
        timeout=30,
    )  # fmt: skip
    assert 400 <= bad.status_code < 500, bad.text
    assert np.allclose(_embed(c.url, SENTENCES[:2]), want[:2], atol=1e-4)
    # the server runs as the image's unprivileged user
    users = docker("top", c.id, "-o", "pid,uid,args").stdout.splitlines()[1:]
    assert users and all(line.split()[1] == "10001" for line in users), users
    code, took = c.stop()
    assert code == 0 and took < 10, (code, took, c.logs())


def test_multi_model_endpoint_in_the_same_image(run, cpu_image, minilm_artifact, tmp_path):
    """The label SageMaker checks, and its load, list, invoke and unload calls, with the
    model data as SageMaker hands it: a folder holding a model.tar.gz (extracted on this
    image's Python 3.11.2, which has no tarfile extraction filters)."""
    labels = json.loads(docker("image", "inspect", "-f", "{{json .Config.Labels}}",
                               cpu_image).stdout)  # fmt: skip
    assert labels.get("com.amazonaws.sagemaker.capabilities.multi-models") == "true"
    models = tmp_path / "models"
    (models / "minilm").mkdir(parents=True)
    with tarfile.open(models / "minilm" / "model.tar.gz", "w:gz") as t:
        for f in sorted(Path(minilm_artifact).iterdir()):
            t.add(f, arcname=f.name)
    c = run("-e", "SAGEMAKER_MULTI_MODEL=true", "-v", f"{models}:/opt/ml/models:ro")
    c.ready()
    loaded = requests.post(
        f"{c.url}/models", json={"model_name": "minilm", "url": "/opt/ml/models/minilm"},
        timeout=300,
    )  # fmt: skip
    assert loaded.status_code == 200, (loaded.text, c.logs())
    listed = requests.get(f"{c.url}/models", timeout=30).json()
    assert [m["modelName"] for m in listed["models"]] == ["minilm"]
    r = requests.post(f"{c.url}/models/minilm/invoke", json={"inputs": SENTENCES[:2]}, timeout=60)
    assert r.status_code == 200, r.text
    assert np.asarray(r.json()).shape == (2, 384)
    assert requests.delete(f"{c.url}/models/minilm", timeout=60).status_code == 200
    assert requests.get(f"{c.url}/models/minilm", timeout=30).status_code == 404
    code, took = c.stop()
    assert code == 0 and took < 10, (code, took, c.logs())


def test_a_hub_id_from_a_mounted_offline_cache(run, tmp_path, tiny_embedder_dir):
    cache = hub_cache(tmp_path / "hf" / "hub", HUB_TEST_ID, tiny_embedder_dir)
    for path in cache.rglob("*"):  # as a download leaves them (the fixture's are private)
        path.chmod(0o755 if path.is_dir() else 0o644)
    c = run("-e", f"HF_MODEL_ID={HUB_TEST_ID}", "-e", "HF_HUB_OFFLINE=1",
            "-e", "HF_HUB_CACHE=/opt/hf/hub", "-v", f"{cache}:/opt/hf/hub:ro")  # fmt: skip
    c.ready()
    texts = ["one short text", "and another one"]
    # a model without a sentence-transformers config: its CLS vector, as it computes it,
    # within the accuracy floor of the precision compiling at start chose (bf16 on AMX)
    got, want = _embed(c.url, texts), _cls(tiny_embedder_dir, texts)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert got.shape == want.shape and cosine.min() > 0.999, cosine
    code, took = c.stop()
    assert code == 0 and took < 10, (code, took, c.logs())


def _cls(model_dir: Path, texts: list[str]) -> np.ndarray:
    """The eager model's first token's last hidden state, one text at a time."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir)
    with torch.no_grad():
        rows = [model.eval()(**tok(t, return_tensors="pt")).last_hidden_state[0, 0] for t in texts]
    return torch.stack(rows).numpy()


def test_the_image_holds_our_server_only(cpu_image):
    """No Java runtime, no tritonserver, no TorchServe or Triton packages: only our server."""
    found = docker("run", "--rm", "--entrypoint", "sh", cpu_image, "-c",
                   "command -v java tritonserver torchserve; python3 -m pip list --format=freeze"
                   " | grep -i -E '^(torchserve|model-archiver|tritonclient|nvidia-pytriton)='"
                   "; true")  # fmt: skip
    assert found.stdout.strip() == "", found.stdout
