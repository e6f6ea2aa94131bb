"""package kubernetes: an artifact -> the image's build context and the manifests that run
it on a cluster, two ways.

    <out>/image/                      the image's build context (`package sagemaker`'s: one
                                      image serves SageMaker, Kubernetes and KServe)
    <out>/plain/                      Deployment, Service, HorizontalPodAutoscaler,
                                      PodDisruptionBudget
    <out>/kserve/                     ServingRuntime + InferenceService
    <out>/prometheus-adapter.yaml     values for the prometheus-adapter chart: the rule that
                                      turns the front's in-flight gauge into the HPA's metric

The pod runs the image's `serve` entrypoint with NEURONSERVE_PLATFORM=kubernetes: the front
on port 8080 with API keys on (the key from a Secret), its workers behind it,
and the worker count planned at start from the cores the pod was granted, never written
into the manifest: on neuronx from NEURON_RT_VISIBLE_CORES, which the Neuron device plugin
sets in the container ("Neuron scheduler extension flow", awsdocs-neuron
containers/tutorials/k8s-neuron-scheduler-flow); on cpu from the pod's cpuset (the static
CPU manager policy) capped by its CPU quota (cores.discover_cpu_cores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .. import targets
from ..spec import DeploySpec, env_of
from .sagemaker.context import ContextError, check_runs, package_sagemaker

# The Kubernetes release the manifests are written for and validated against (tests).
KUBERNETES_VERSION = "1.31"
# KServe release whose API models the KServe manifests are validated against (tests).
KSERVE_VERSION = "0.15.2"
TARGETS = ("cpu", "neuronx")
PORT = 8080
# The resource the Neuron device plugin registers for single NeuronCores ("Kubernetes
# environment setup for Neuron", awsdocs-neuron containers/tutorials/k8s-setup).
NEURONCORE = "aws.amazon.com/neuroncore"
# "The scheduler extension is required for scheduling Pods that request more than one
# Neuron core or device resource"; on EKS it runs as a second scheduler named my-scheduler
# (awsdocs-neuron deploy/infrastructure/scheduler and
# containers/tutorials/k8s-multiple-scheduler).
NEURON_SCHEDULER = "my-scheduler"
IN_FLIGHT_METRIC = "neuronserve_front_in_flight"
# Requests in flight per worker that keep a worker busy without queueing long: throughput
# is near its plateau at about eight per worker (BENCHMARKS.md, the front against its
# workers); beyond that only latency grows.
IN_FLIGHT_PER_WORKER = 8
# Loading a model and warming every bucket: minutes for a Neuron artifact on first load.
STARTUP_S = 600
API_KEY_ITEM = "api-key"
# the image's USER (Dockerfile.*): named in the manifest so runAsNonRoot is checked
# against a number the kubelet sees, as the restricted Pod Security Standard asks
IMAGE_UID = 10001
# The pod's only writable folder, its /tmp (the image's HOME and the server's work folder:
# the workers' store, their sockets and logs, Hub downloads): an emptyDir of medium Memory,
# a tmpfs, whose root is mode 1777 as a /tmp should be; a disk emptyDir is 0777 without the
# sticky bit, where another user could rename the server's private folders away
# (kubernetes pkg/volume/emptydir: defaultPerm 0777; tmpfs's own default mode is 1777).
# Its pages count against the pod's memory: the store's copy of the models, plus this.
SCRATCH_RESERVE = 256 * 2**20


class ClusterError(ContextError):
    pass


@dataclass(frozen=True)
class ClusterOptions:
    """What the manifests need beyond the spec. Each None is derived from the artifact."""

    image: str
    namespace: str = "default"
    cores: int | None = None  # NeuronCores (neuronx) or CPUs (cpu) per pod
    memory: str | None = None  # per pod, a Kubernetes quantity
    min_replicas: int = 1
    max_replicas: int = 4
    in_flight_target: int | None = None  # per pod, for the autoscaler
    model_claim: str | None = None  # a PersistentVolumeClaim holding the model
    api_key_secret: str | None = None  # Secret with the key under API_KEY_ITEM
    scheduler: str | None = None  # neuronx with more than one core: the extension's
    # where the Triton repository and TorchServe store `package triton|torchserve` wrote
    # are kept for KServe's own runtimes (`<store_uri>/triton`, `<store_uri>/torchserve`)
    store_uri: str = "s3://YOUR-BUCKET/neuronserve"


@dataclass(frozen=True)
class Pod:
    """The facts every manifest shares, derived once."""

    name: str
    target: str
    cores: int
    cores_per_worker: int
    memory: str
    scratch: str  # the /tmp emptyDir's sizeLimit, part of `memory`
    secret: str
    grace_s: int
    options: ClusterOptions

    @property
    def workers(self) -> int:
        return max(1, self.cores // self.cores_per_worker)

    @property
    def in_flight_target(self) -> int:
        return self.options.in_flight_target or IN_FLIGHT_PER_WORKER * self.workers

    @property
    def labels(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.name, "app.kubernetes.io/part-of": "neuronserve"}

    @property
    def scheduler(self) -> str | None:
        if self.options.scheduler is not None:
            return self.options.scheduler or None
        return NEURON_SCHEDULER if self.target == "neuronx" and self.cores > 1 else None

    def resources(self) -> dict[str, Any]:
        # requests == limits with whole CPUs: Guaranteed QoS, which the static CPU manager
        # policy turns into exclusive cores that the workers pin to
        if self.target == "neuronx":
            amounts = {NEURONCORE: str(self.cores), "memory": self.memory}
        else:
            amounts = {"cpu": str(self.cores), "memory": self.memory}
        return {"requests": dict(amounts), "limits": dict(amounts)}

    def env(self, model_dir: str | None) -> list[dict[str, Any]]:
        env: list[dict[str, Any]] = [
            {"name": "NEURONSERVE_PLATFORM", "value": "kubernetes"},
            {"name": env_of("worker", "cores_per_worker"), "value": str(self.cores_per_worker)},
            # Prometheus scrapes by annotation, without a key; the other routes need one
            {"name": env_of("front", "metrics_auth"), "value": "off"},
            {
                "name": "NEURONSERVE_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": self.secret, "key": API_KEY_ITEM}},
            },
        ]
        if model_dir:
            env.append({"name": "NEURONSERVE_MODEL_DIR", "value": model_dir})
        return env

    def container(self, name: str, model_dir: str | None) -> dict[str, Any]:
        def probe(path: str, period: int, failures: int) -> dict[str, Any]:
            return {
                "httpGet": {"path": path, "port": PORT},
                "periodSeconds": period,
                "timeoutSeconds": 5,
                "failureThreshold": failures,
            }

        return {
            "name": name,
            "image": self.options.image,
            "args": ["serve"],
            "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
            "env": self.env(model_dir),
            "resources": self.resources(),
            # the restricted Pod Security Standard: the image's user, checked by the
            # kubelet, no way back to root, nothing written outside the scratch volume
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": IMAGE_UID,
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
            # /ping is 200 only once every worker has loaded and warmed up
            "startupProbe": probe("/ping", 5, STARTUP_S // 5),
            "readinessProbe": probe("/ping", 5, 2),
            # /health is 503 once no worker can serve (a worker being replaced leaves it
            # 200, "degraded"): a pod whose workers have not come back within two minutes
            # is restarted
            "livenessProbe": probe("/health", 10, 12),
        }

    def volumes(self) -> list[dict[str, Any]]:
        return [{"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": self.scratch}}]


def _pod(spec: DeploySpec, target: str, o: ClusterOptions) -> Pod:
    try:
        names = check_runs(spec, target, "pod")
    except ContextError as e:
        raise ClusterError(str(e)) from None
    name = names[0] if len(names) == 1 else spec.deployment_name
    cores_per_worker = spec.worker.cores_per_worker
    cores = o.cores or (2 if target == "neuronx" else 2 * cores_per_worker)
    if cores % cores_per_worker:
        raise ClusterError(
            f"--cores {cores} is not a multiple of cores_per_worker {cores_per_worker}"
        )
    if o.min_replicas < 1 or o.max_replicas < o.min_replicas:
        raise ClusterError(f"replicas: need 1 <= min ({o.min_replicas}) <= max ({o.max_replicas})")
    model_bytes = _artifact_bytes(spec)
    scratch = model_bytes + SCRATCH_RESERVE  # the workers' store copies every model
    memory = o.memory or _memory(spec, target, cores // cores_per_worker, model_bytes, scratch)
    return Pod(
        name=_dns_name(name),
        target=target,
        cores=cores,
        cores_per_worker=cores_per_worker,
        memory=memory,
        scratch=f"{math.ceil(scratch / 2**20)}Mi",
        secret=o.api_key_secret or f"{_dns_name(name)}-api-key",
        # the front drains for up to its deadline, then stops its workers
        grace_s=int(spec.front.deadline_s) + 30,
        options=o,
    )


def _dns_name(name: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")[:50]
    if not out:
        raise ClusterError(f"model name {name!r} gives no valid Kubernetes name")
    return out


def _artifact_bytes(spec: DeploySpec) -> int:
    return sum(
        f.stat().st_size for e in spec.model_entries() for f in Path(e.artifact).rglob("*")
        if f.is_file()
    )  # fmt: skip


def _memory(spec: DeploySpec, target: str, workers: int, model_bytes: int, scratch: int) -> str:
    """The pod's memory: on CPU what the server's own memory plan asks of the host for
    these workers (placement.memory_plan: each worker's models, activations and runtime,
    and the front's and the supervisor's reserve), so a pod at its limit starts;
    on Neuron, where the models live on the device, the host's share: the weights once
    more per worker while loading, the front and the tokenizers. Both with the scratch
    tmpfs on top."""
    from .. import placement
    from ..artifact import read_manifest

    entries = spec.model_entries()
    if targets.core_kind(target) == "cpu":
        models = []
        for e in entries:
            manifest = read_manifest(e.artifact, verify=False)
            models.append((e.served_name(manifest.name), manifest, Path(e.artifact)))
        plan = placement.WorkerPlan("cpu", workers, spec.worker.cores_per_worker, None)
        need = placement.memory_plan(models, plan, None, target).need
        return f"{math.ceil((workers * need + placement.HOST_RESERVE + scratch) / 2**30)}Gi"
    return f"{math.ceil(1.5 + (2 * workers * model_bytes + scratch) / 2**30)}Gi"


def deployment(pod: Pod, namespace: str, replicas: int, claim: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": pod.grace_s,
        "containers": [pod.container("neuronserve", "/mnt/models" if claim else None)],
        "volumes": pod.volumes(),
    }
    if pod.scheduler:
        spec["schedulerName"] = pod.scheduler
    if claim:
        spec["containers"][0]["volumeMounts"].append(
            {"name": "model", "mountPath": "/mnt/models", "readOnly": True}
        )
        spec["volumes"].append(
            {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": pod.name, "namespace": namespace, "labels": pod.labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": pod.name}},
            # a new pod must be ready before an old one goes: capacity never drops
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {
                    "labels": pod.labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": spec,
            },
        },
    }


def service(pod: Pod, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": pod.name, "namespace": namespace, "labels": pod.labels},
        "spec": {
            "selector": {"app.kubernetes.io/name": pod.name},
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def autoscaler(pod: Pod, namespace: str, low: int, high: int) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": pod.name, "namespace": namespace, "labels": pod.labels},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": pod.name},
            "minReplicas": low,
            "maxReplicas": high,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": IN_FLIGHT_METRIC},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": str(pod.in_flight_target),
                        },
                    },
                }
            ],
            # a new pod takes minutes to warm up: scale up at once, down slowly
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
                },
                "scaleDown": {"stabilizationWindowSeconds": 300},
            },
        },
    }


def disruption_budget(pod: Pod, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": pod.name, "namespace": namespace, "labels": pod.labels},
        "spec": {
            # one pod at a time may be evicted (a node drain never takes them all)
            "maxUnavailable": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": pod.name}},
        },
    }


def serving_runtime(pod: Pod, namespace: str) -> dict[str, Any]:
    container = pod.container("kserve-container", "/mnt/models")
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": f"neuronserve-{pod.name}", "namespace": namespace},
        "spec": {
            "annotations": {
                "prometheus.kserve.io/port": str(PORT),
                "prometheus.kserve.io/path": "/metrics",
            },
            "supportedModelFormats": [{"name": "neuronserve", "version": "1", "autoSelect": True}],
            "protocolVersions": ["v1"],
            "containers": [container],
            "volumes": pod.volumes(),
        },
    }


def inference_service(pod: Pod, namespace: str, claim: str | None) -> dict[str, Any]:
    o = pod.options
    model: dict[str, Any] = {
        "modelFormat": {"name": "neuronserve", "version": "1"},
        "runtime": f"neuronserve-{pod.name}",
        "resources": pod.resources(),
    }
    # KServe's storage initializer puts the model in /mnt/models; without one the image's
    # baked model is served
    if claim:
        model["storageUri"] = f"pvc://{claim}/"
    predictor: dict[str, Any] = {
        "minReplicas": o.min_replicas,
        "maxReplicas": o.max_replicas,
        # Knative's concurrency: requests in flight per pod, the same signal as the HPA's
        "scaleMetric": "concurrency",
        "scaleTarget": pod.in_flight_target,
        "terminationGracePeriodSeconds": pod.grace_s,
        "model": model,
    }
    return _inference_service(pod, namespace, pod.name, predictor)


def _inference_service(
    pod: Pod, namespace: str, name: str, predictor: dict[str, Any]
) -> dict[str, Any]:
    """An InferenceService of `predictor`, on the Neuron scheduler where the pod needs it."""
    if pod.scheduler:
        predictor["schedulerName"] = pod.scheduler
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace, "labels": pod.labels},
        "spec": {"predictor": predictor},
    }


# KServe's own runtimes, serving what `package triton` and `package torchserve` wrote:
# kserve-tritonserver runs `tritonserver --model-repository=/mnt/models`; kserve-torchserve
# reads /mnt/models/config/config.properties and the archives in /mnt/models/model-store
# (KServe's "Deploy a PyTorch model with TorchServe" and "Triton" serving runtime pages)
# (the folder under store_uri, KServe's model format, its protocol)
PLUGINS = (("triton", "triton", "v2"), ("torchserve", "pytorch", "v1"))


def plugin_inference_service(
    pod: Pod, namespace: str, server: str, fmt: str, protocol: str
) -> dict[str, Any]:
    """An InferenceService for KServe's own Triton or TorchServe runtime, its storage the
    repository or store neuronserve packaged, its resources the pod's: the same core
    groups, each instance or worker leasing and pinning its own."""
    model: dict[str, Any] = {
        "modelFormat": {"name": fmt},
        "protocolVersion": protocol,
        "storageUri": f"{pod.options.store_uri.rstrip('/')}/{server}",
        "resources": pod.resources(),
    }
    predictor: dict[str, Any] = {
        "minReplicas": pod.options.min_replicas,
        "maxReplicas": pod.options.max_replicas,
        "model": model,
    }
    return _inference_service(pod, namespace, f"{pod.name}-{server}", predictor)


def adapter_values(namespace: str) -> dict[str, Any]:
    """prometheus-adapter (prometheus-community chart) values exposing the front's gauge
    as a per-pod custom metric."""
    return {
        "rules": {
            "custom": [
                {
                    "seriesQuery": f'{IN_FLIGHT_METRIC}{{namespace="{namespace}",pod!=""}}',
                    "resources": {
                        "overrides": {
                            "namespace": {"resource": "namespace"},
                            "pod": {"resource": "pod"},
                        }
                    },
                    "name": {"as": IN_FLIGHT_METRIC},
                    "metricsQuery": "sum(avg_over_time(<<.Series>>{<<.LabelMatchers>>}[1m])) "
                    "by (<<.GroupBy>>)",
                }
            ]
        }
    }


def manifests(
    spec: DeploySpec, target: str, options: ClusterOptions
) -> dict[str, list[dict[str, Any]]]:
    """Every object, by the file it goes to."""
    if target not in TARGETS:
        raise ClusterError(f"target {target!r}: choose {' or '.join(TARGETS)}")
    pod = _pod(spec, target, options)
    ns, claim = options.namespace, options.model_claim
    return {
        "plain/deployment.yaml": [deployment(pod, ns, options.min_replicas, claim)],
        "plain/service.yaml": [service(pod, ns)],
        "plain/autoscaler.yaml": [autoscaler(pod, ns, options.min_replicas, options.max_replicas)],
        "plain/disruption-budget.yaml": [disruption_budget(pod, ns)],
        "kserve/serving-runtime.yaml": [serving_runtime(pod, ns)],
        "kserve/inference-service.yaml": [inference_service(pod, ns, claim)],
        **{
            f"kserve-{server}/inference-service.yaml": [
                plugin_inference_service(pod, ns, server, fmt, protocol)
            ]
            for server, fmt, protocol in PLUGINS
        },
    }


def package_kubernetes(spec: DeploySpec, target: str, out: Path, options: ClusterOptions) -> Pod:
    """Write the image's build context and every manifest under `out`, for the spec's
    models (one or several)."""
    objects = manifests(spec, target, options)
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / "plain").is_dir():
        raise ClusterError(f"{out} exists and is not a neuronserve Kubernetes folder")
    package_sagemaker(spec, target, out / "image")
    for rel, docs in objects.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    (out / "prometheus-adapter.yaml").write_text(
        yaml.safe_dump(adapter_values(options.namespace), sort_keys=False)
    )
    return _pod(spec, target, options)
