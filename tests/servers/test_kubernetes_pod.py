"""The pod `package kubernetes` describes, run as a process: the image's `serve`
entrypoint with the Deployment's own environment (the Secret's key put in its place),
one CPU granted. It needs the key on every route but the probes and /metrics, plans its
workers from the one core it was granted, and answers through TorchServe."""

from __future__ import annotations

import pytest
import requests
import yaml
from helpers import SageMakerServe, run_cli

pytestmark = pytest.mark.server

KEY = "pod-key-0123456789abcdef0123456789"


@pytest.fixture(scope="module")
def pod(tmp_path_factory, minilm_artifact):
    work = tmp_path_factory.mktemp("k8s")
    out = work / "k8s"
    run_cli(
        "package", "kubernetes", minilm_artifact, "--image", "registry.example/minilm:1",
        "--out", out, "--name", "minilm", "--cores", "1",
    )  # fmt: skip
    deploy = yaml.safe_load((out / "plain" / "deployment.yaml").read_text())
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {}
    for e in container["env"]:
        env[e["name"]] = KEY if "valueFrom" in e else e["value"]
    serve = SageMakerServe(
        out / "image",
        work / "no-mounted-model",  # empty: the model baked into the image is served
        work,
        NEURONSERVE_BAKED_MODEL=str(out / "image" / "model"),
        NEURONSERVE_CORES="0",  # the pod was granted one core
        **env,
    )
    try:
        serve.watch_until_ready()
    except BaseException:
        serve.stop()
        raise
    yield serve
    serve.stop()


def test_the_pod_needs_its_key_except_for_probes_and_metrics(pod):
    text = ["a pod on a cluster"]
    assert requests.post(f"{pod.url}/embed", json={"inputs": text}, timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert (
        requests.post(
            f"{pod.url}/embed", json={"inputs": text}, headers=wrong, timeout=30
        ).status_code
        == 401
    )
    ok = requests.post(
        f"{pod.url}/embed", json={"inputs": text}, headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )  # fmt: skip
    assert ok.status_code == 200 and len(ok.json()[0]) == 384
    for probe in ("/ping", "/health"):
        assert requests.get(f"{pod.url}{probe}", timeout=10).status_code == 200
    metrics = requests.get(f"{pod.url}/metrics", timeout=10)
    assert metrics.status_code == 200 and "neuronserve_front_in_flight" in metrics.text


def test_workers_follow_the_granted_cores(pod):
    health = requests.get(f"{pod.url}/health", timeout=10).json()
    assert health["workers_expected"] == 1 == health["workers_ready"]
    assert "(SageMaker's contract)" not in pod.log.read_text()
