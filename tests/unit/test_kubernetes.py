"""`package kubernetes`: every combination rendered and validated against the Kubernetes
API schemas (kubernetes-validate, strict, at the version the manifests are written for)
and KServe's own API models (tests/kserve_schema.py); the facts the pods depend on; the
CPU quota that sizes workers in a pod; the entrypoint's Kubernetes mode refusing to start
without its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import cli
from kserve_schema import validate_kserve
from typer.testing import CliRunner

from neuronserve import cores
from neuronserve.artifact import read_manifest
from neuronserve.cli import app
from neuronserve.platforms import kubernetes as k8s
from neuronserve.spec import DeploySpec, load_spec

kubernetes_validate = pytest.importorskip("kubernetes_validate")


def spec_of(*artifacts: Path, **fields) -> DeploySpec:
    """What `package kubernetes` makes of its artifacts and flags."""
    several = {"models": [{"artifact": a} for a in artifacts]}
    return load_spec(
        None, {**(several if len(artifacts) > 1 else {"artifact": artifacts[0]}), **fields}
    )


@pytest.mark.parametrize(
    ("target", "several"),
    # every target, and the CPU image both ways (a set of models: one pod, every worker
    # holding all of them)
    [*((t, False) for t in k8s.TARGETS), ("cpu", True)],
)
def test_every_combination_renders_and_validates(  # noqa: PLR0915 - one rendering, read whole
    target, several, tmp_path, tiny_artifact, classifier_artifact, neuronx_manifest_artifact
):
    artifacts = [neuronx_manifest_artifact] if target == "neuronx" else [tiny_artifact]
    if several:  # a set of models: one pod, every worker holding all of them
        artifacts.append(classifier_artifact)
    out = tmp_path / "k8s"
    result = CliRunner().invoke(app, [
        "package", "kubernetes", *map(str, artifacts), "--target", target,
        "--image", "registry.example/minilm:1", "--out", str(out), "--max-replicas", "6",
        "--namespace", "serving",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "kubectl apply -f" in result.output and "create secret generic" in result.output
    assert (out / "image" / "Dockerfile").is_file() and (out / "image" / "serve").is_file()
    # our server only: no Java runtime, no tritonserver
    assert "openjdk" not in (out / "image" / "Dockerfile").read_text()
    assert "torchserve" not in (out / "image" / "requirements.txt").read_text()
    context = json.loads((out / "image" / "neuronserve.json").read_text())
    assert context["models"] == [read_manifest(a).name for a in artifacts]
    files = sorted(p.relative_to(out).as_posix() for p in out.glob("*/*.yaml"))
    assert files == sorted(k8s.manifests(spec_of(*artifacts), target,
                                         k8s.ClusterOptions(image="x")))  # fmt: skip
    docs = {f: list(yaml.safe_load_all((out / f).read_text())) for f in files}
    kinds = []
    for objs in docs.values():
        for obj in objs:
            kinds.append(obj["kind"])
            assert obj["metadata"]["namespace"] == "serving"
            if obj["apiVersion"].startswith("serving.kserve.io/"):
                validate_kserve(obj)
            else:
                kubernetes_validate.validate(obj, k8s.KUBERNETES_VERSION, strict=True)
    assert sorted(kinds) == sorted(
        ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
         "ServingRuntime", "InferenceService", "InferenceService", "InferenceService"]
    )  # fmt: skip
    # KServe's own Triton and TorchServe runtimes, on what `package triton|torchserve`
    # wrote, with the same resources as our pod (one instance or worker per core group)
    for server, fmt in (("triton", "triton"), ("torchserve", "pytorch")):
        (plugin,) = docs[f"kserve-{server}/inference-service.yaml"]
        model = plugin["spec"]["predictor"]["model"]
        assert model["modelFormat"] == {"name": fmt} and "runtime" not in model
        assert model["storageUri"] == f"s3://YOUR-BUCKET/neuronserve/{server}"

    deploy = docs["plain/deployment.yaml"][0]
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    limits = c["resources"]["limits"]
    assert c["resources"]["requests"] == limits  # Guaranteed QoS
    for server in ("triton", "torchserve"):
        (plugin,) = docs[f"kserve-{server}/inference-service.yaml"]
        assert plugin["spec"]["predictor"]["model"]["resources"] == c["resources"]
    if target == "neuronx":
        assert limits[k8s.NEURONCORE] == "2" and "cpu" not in limits
        assert pod["schedulerName"] == "my-scheduler"  # more than one NeuronCore
    else:
        assert limits["cpu"] == "2" and k8s.NEURONCORE not in limits
        assert "schedulerName" not in pod
    env = {e["name"]: e for e in c["env"]}
    assert env["NEURONSERVE_PLATFORM"]["value"] == "kubernetes"
    assert "NEURONSERVE_ENGINE" not in env
    assert env["NEURONSERVE_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "api-key"
    # the worker count is not in the manifest: the pod plans it from its granted cores
    assert not any("WORKERS" in name for name in env)
    assert c["readinessProbe"]["httpGet"]["path"] == "/ping"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert pod["terminationGracePeriodSeconds"] > 60  # the front's default deadline
    annotations = deploy["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"

    hpa = docs["plain/autoscaler.yaml"][0]["spec"]
    assert hpa["maxReplicas"] == 6
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "neuronserve_front_in_flight"
    assert hpa["metrics"][0]["pods"]["target"]["averageValue"] == "16"  # 2 workers x 8

    isvc = docs["kserve/inference-service.yaml"][0]["spec"]["predictor"]
    runtime = docs["kserve/serving-runtime.yaml"][0]
    assert isvc["model"]["runtime"] == runtime["metadata"]["name"]
    assert isvc["model"]["resources"] == c["resources"]
    assert isvc["scaleMetric"] == "concurrency" and isvc["scaleTarget"] == 16
    renv = {e["name"]: e for e in runtime["spec"]["containers"][0]["env"]}
    assert renv["NEURONSERVE_MODEL_DIR"]["value"] == "/mnt/models"  # KServe's storage path

    adapter = yaml.safe_load((out / "prometheus-adapter.yaml").read_text())
    assert adapter["rules"]["custom"][0]["name"]["as"] == "neuronserve_front_in_flight"


def test_a_claim_mounts_the_model_and_kserve_fetches_it(tiny_artifact):
    objs = k8s.manifests(
        spec_of(tiny_artifact), "cpu",
        k8s.ClusterOptions(image="x", model_claim="models", cores=4, in_flight_target=5),
    )  # fmt: skip
    deploy = objs["plain/deployment.yaml"][0]
    kubernetes_validate.validate(deploy, k8s.KUBERNETES_VERSION, strict=True)
    pod = deploy["spec"]["template"]["spec"]
    assert pod["volumes"][-1]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    (c,) = pod["containers"]
    assert {"name": "model", "mountPath": "/mnt/models", "readOnly": True} in c["volumeMounts"]
    assert {"name": "NEURONSERVE_MODEL_DIR", "value": "/mnt/models"} in c["env"]
    assert c["resources"]["limits"]["cpu"] == "4"
    isvc = objs["kserve/inference-service.yaml"][0]
    validate_kserve(isvc)
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == "pvc://models/"
    hpa = objs["plain/autoscaler.yaml"][0]["spec"]["metrics"][0]["pods"]["target"]
    assert hpa["averageValue"] == "5"


def test_the_validators_catch_what_a_cluster_would_refuse(tiny_artifact):
    """The schemas are strict enough to matter: a misspelt field and a wrong type fail."""
    objs = k8s.manifests(spec_of(tiny_artifact), "cpu", k8s.ClusterOptions("x"))
    deploy = objs["plain/deployment.yaml"][0]
    deploy["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deploy, k8s.KUBERNETES_VERSION, strict=True)
    isvc = objs["kserve/inference-service.yaml"][0]
    isvc["spec"]["predictor"]["minReplicas"] = "one"
    with pytest.raises(Exception, match="one"):
        validate_kserve(isvc)


def test_bad_options_are_refused(tiny_artifact, neuronx_manifest_artifact):
    spec = spec_of(tiny_artifact, cores_per_worker=2)
    with pytest.raises(k8s.ClusterError, match="multiple of cores_per_worker"):
        k8s.manifests(spec, "cpu", k8s.ClusterOptions("x", cores=3))
    with pytest.raises(k8s.ClusterError, match="replicas"):
        k8s.manifests(
            spec_of(tiny_artifact), "cpu",
            k8s.ClusterOptions("x", min_replicas=3, max_replicas=2),
        )  # fmt: skip
    with pytest.raises(k8s.ClusterError, match="compiled for cpu"):
        k8s.manifests(spec_of(tiny_artifact), "neuronx", k8s.ClusterOptions("x"))
    with pytest.raises(k8s.ClusterError, match="target 'cuda'"):
        k8s.manifests(spec_of(tiny_artifact), "cuda", k8s.ClusterOptions("x"))
    one_core = k8s.manifests(
        spec_of(neuronx_manifest_artifact), "neuronx", k8s.ClusterOptions("x", cores=1)
    )
    assert "schedulerName" not in one_core["plain/deployment.yaml"][0]["spec"]["template"]["spec"]


def test_image_is_required(tmp_path, tiny_artifact):
    r = cli("package", "kubernetes", tiny_artifact, "--out", tmp_path / "k", check=False)
    assert r.returncode == 2 and "--image is required" in r.stderr


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_cpu_quota_of_cgroup_v2_and_v1(tmp_path, files, expected):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert cores.cpu_quota(tmp_path) == expected


def test_a_pod_plans_workers_from_its_quota_not_the_nodes_cores(tmp_path, monkeypatch):
    """A pod limited to 1.5 CPUs on a node whose cores all show in its affinity gets one
    worker, not one per node core."""
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    monkeypatch.setattr(cores, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda _: set(range(16)))
    monkeypatch.delenv(cores.CORES_ENV, raising=False)
    assert cores.discover_cpu_cores() == [0]
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cores.discover_cpu_cores() == list(range(16))


def test_kubernetes_mode_needs_its_key(monkeypatch):
    from neuronserve.platforms.sagemaker import entrypoint as sagemaker

    monkeypatch.setenv("NEURONSERVE_PLATFORM", "kubernetes")
    monkeypatch.delenv("NEURONSERVE_API_KEY", raising=False)
    with pytest.raises(sagemaker.PlatformError, match="NEURONSERVE_API_KEY is empty"):
        sagemaker.platform()
    monkeypatch.setenv("NEURONSERVE_API_KEY", "k" * 32)
    assert sagemaker.platform() == "kubernetes"
    monkeypatch.setenv("NEURONSERVE_PLATFORM", "ecs")
    with pytest.raises(sagemaker.PlatformError, match="sagemaker or kubernetes"):
        sagemaker.platform()
    monkeypatch.setenv("NEURONSERVE_PLATFORM", "sagemaker")
    assert sagemaker.platform() == "sagemaker"
    # unset: the image run outside SageMaker does not answer without a key by default
    monkeypatch.delenv("NEURONSERVE_PLATFORM")
    with pytest.raises(sagemaker.PlatformError, match="NEURONSERVE_PLATFORM is not set"):
        sagemaker.platform()


def test_a_pods_memory_is_what_the_servers_own_memory_plan_asks(tiny_artifact, monkeypatch):
    """The limit the Deployment writes is the one at which the server's own check (each
    worker's models, activations and runtime, and the front's reserve) passes with the
    scratch tmpfs full, and a GiB less is refused by it: the pod does not crash-loop on its
    own memory plan."""
    from neuronserve import placement

    spec = spec_of(tiny_artifact)
    deploy = k8s.manifests(spec, "cpu", k8s.ClusterOptions("x", cores=8))["plain/deployment.yaml"]
    limits = deploy[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["cpu"] == "8" and limits["memory"].endswith("Gi")
    (scratch,) = deploy[0]["spec"]["template"]["spec"]["volumes"]
    assert scratch["emptyDir"]["medium"] == "Memory"  # its pages count against the limit
    limit = int(limits["memory"][:-2]) * 2**30 - int(scratch["emptyDir"]["sizeLimit"][:-2]) * 2**20
    manifest = read_manifest(tiny_artifact)
    models = [(manifest.name, manifest, tiny_artifact)]
    plan = placement.WorkerPlan("cpu", 8, 1, 8)
    for memory, fits in ((limit, True), (limit - 2**30, False)):
        monkeypatch.setattr(placement, "_host_memory", lambda m=memory: m)
        assert placement.memory_plan(models, plan, None).fits is fits, placement.memory_plan(
            models, plan, None
        ).lines()
