"""The pods `neuronserve package kubernetes` describes, run as a kubelet runs them: the
Deployment's container and KServe's (its ServingRuntime's container with the
InferenceService's resources, the model where KServe's storage initializer puts it), each
with its command, environment (the Secret's key in its place), port, securityContext,
volumes and limits as written, and its startup, readiness and liveness probes polled as
declared. The Deployment has the default two CPUs (two workers: the memory its limit
gives must hold the server's own plan for both); KServe's pod is granted one, and plans one
worker from that quota, not from the host's cores."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml
from conftest import build_args
from helpers import SENTENCES, reference_embeddings, run_cli
from images import docker
from kubelet import Pod, run_args

IMAGE = "neuronserve-test/minilm:k8s"
KEY = "pod-key-0123456789abcdef0123456789"


@pytest.fixture(scope="module")
def packaged(tmp_path_factory, minilm_artifact) -> tuple[Path, Path]:
    """What the guide's `package kubernetes` writes: the model baked into the image, and
    (a second rendering, one CPU) the model on a claim, as KServe fetches it to
    /mnt/models."""
    work = tmp_path_factory.mktemp("k8s")
    outs = []
    for name, extra in (("baked", []), ("claim", ["--model-claim", "models", "--cores", "1"])):
        out = work / name
        run_cli("package", "kubernetes", minilm_artifact, "--target", "cpu", "--image", IMAGE,
                "--out", out, "--name", "minilm", *extra)  # fmt: skip
        outs.append(out)
    return outs[0], outs[1]


@pytest.fixture(scope="module")
def image(base_image: str, packaged) -> str:
    """`docker build -t <image> k8s/image`, as the guide builds it."""
    built = docker("build", "-t", IMAGE, *build_args(base_image), str(packaged[0] / "image"),
                   check=False, timeout=1800)  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    return IMAGE


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for p in started:
        p.remove()


def _objects(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _secrets(container: dict) -> dict[tuple[str, str], str]:
    refs = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e]
    return {(r["name"], r["key"]): KEY for r in refs}


def _embed(url: str, texts: list[str], key: str | None = KEY) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"{url}/embed", json={"inputs": texts}, headers=headers, timeout=60)


def _started(pod: Pod, container: dict) -> None:
    startup = container["startupProbe"]
    took = pod.started()
    assert took < startup["periodSeconds"] * startup["failureThreshold"], took
    pod.ready()


def test_the_deployments_pod_as_a_kubelet_runs_it(pods, image, packaged, minilm_dir):
    spec = _objects(packaged[0] / "plain" / "deployment.yaml")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
    pods.append(pod := Pod(container, run_args(spec, container, image, _secrets(container), {})))
    _started(pod, container)
    # the declared port answers with the Secret's key only; the probes and /metrics need none
    assert _embed(pod.url, SENTENCES[:1], key=None).status_code == 401
    assert _embed(pod.url, SENTENCES[:1], key="not-the-key").status_code == 401
    got = _embed(pod.url, SENTENCES)
    assert got.status_code == 200, got.text
    want = reference_embeddings(minilm_dir, SENTENCES)
    assert np.allclose(np.asarray(got.json(), dtype=np.float32), want, atol=1e-4)
    metrics = requests.get(f"{pod.url}/metrics", timeout=10)
    assert metrics.status_code == 200 and "neuronserve_front_in_flight" in metrics.text
    # a worker per CPU granted, each within the memory the limit gives
    health = requests.get(f"{pod.url}/health", timeout=10).json()
    assert container["resources"]["limits"]["cpu"] == "2"
    assert health["workers_expected"] == 2 == health["workers_ready"], health
    # the root filesystem is read-only, and the server wrote only to the scratch volume
    assert docker("exec", pod.id, "touch", "/opt/neuronserve/x", check=False).returncode != 0
    scratch = docker("exec", pod.id, "ls", "-A", "/tmp").stdout.split()
    assert any(name.startswith("ns-sm-") for name in scratch), scratch
    assert "Read-only file system" not in pod.logs()
    pod.lived(probes=2)
    grace = spec["terminationGracePeriodSeconds"]
    code, took = pod.stop(grace)
    assert code == 0 and took < grace, (code, took, pod.logs())


def test_kserves_pod_with_the_model_its_storage_initializer_fetched(
    pods, image, packaged, minilm_artifact, minilm_dir, tmp_path
):
    runtime = _objects(packaged[1] / "kserve" / "serving-runtime.yaml")["spec"]
    model = _objects(packaged[1] / "kserve" / "inference-service.yaml")["spec"]["predictor"][
        "model"
    ]
    assert model["storageUri"] == "pvc://models/"
    # KServe mounts what its storage initializer copied at /mnt/models, read-only
    (container,) = runtime["containers"]
    container = {**container, "volumeMounts": [
        *container["volumeMounts"],
        {"name": "kserve-provision-location", "mountPath": "/mnt/models", "readOnly": True},
    ]}  # fmt: skip
    spec = {**runtime, "volumes": [
        *runtime["volumes"],
        {"name": "kserve-provision-location", "persistentVolumeClaim": {"claimName": "models"}},
    ]}  # fmt: skip
    fetched = tmp_path / "models"
    shutil.copytree(minilm_artifact, fetched)
    args = run_args(spec, container, image, _secrets(container), {"models": fetched},
                    resources=model["resources"])  # fmt: skip
    pods.append(pod := Pod(container, args))
    _started(pod, container)
    got = _embed(pod.url, SENTENCES[:3])
    assert got.status_code == 200, got.text
    want = reference_embeddings(minilm_dir, SENTENCES[:3])
    assert np.allclose(np.asarray(got.json(), dtype=np.float32), want, atol=1e-4)
    assert "from /mnt/models" in pod.logs()
    # one CPU granted (the CPU quota, not the host's cores): one worker
    health = requests.get(f"{pod.url}/health", timeout=10).json()
    assert health["workers_expected"] == 1 == health["workers_ready"], health


def test_a_pod_in_a_user_namespace(pods, image, packaged):
    """A pod whose runtime gives it a user namespace without mapping the host's root
    (rootless runtimes; `/` then shows as the overflow uid 65534): the server's folder
    checks still hold and it serves. The Deployment's container, started under
    `unshare --user --map-current-user` (which needs the Unconfined seccomp profile)."""
    spec = _objects(packaged[0] / "plain" / "deployment.yaml")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    container = {
        **container,
        "command": ["unshare", "--user", "--map-current-user", "/usr/local/bin/serve"],
        "securityContext": {**container["securityContext"],
                            "seccompProfile": {"type": "Unconfined"}},
    }  # fmt: skip
    pods.append(pod := Pod(container, run_args(spec, container, image, _secrets(container), {})))
    _started(pod, container)
    # the server's user namespace maps its own uid only
    assert docker("exec", pod.id, "cat", "/proc/1/uid_map").stdout.split() == [
        "10001", "10001", "1"
    ]  # fmt: skip
    assert _embed(pod.url, SENTENCES[:1]).status_code == 200
