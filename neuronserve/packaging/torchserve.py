"""package torchserve: artifact -> <store>/<name>.mar, model-config.yaml, config.properties.

The archive holds the handler from `handlers/` and the artifact under `artifact/`. Its
model-config.yaml sets workers = core groups and batchSize = the largest compiled
batch, so TorchServe never forms a batch the grid cannot hold in one bucket run.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from ..artifact import read_manifest
from ..compile import get_target
from ..cores import NoFreeCoreGroup, discover, group_count
from ..resources import handler_file, tool
from ..spec import DeploySpec

HANDLER = "neuronserve_handler.py"
ARTIFACT_DIR = "artifact"
CONFIG_FILE = "config.properties"
METRICS_FILE = "metrics.yaml"

# Our model metrics, declared so TorchServe's prometheus endpoint exports them. Each
# metric gets its own dimension list: a shared one would be written as a YAML alias,
# and TorchServe's frontend appends Hostname to the aliased list once per metric.
def _dims(*extra: str) -> list[str]:
    return ["ModelName", "Level", *extra]


NEURONSERVE_METRICS = {
    "counter": [
        {"name": "NeuronServeBucketRuns", "unit": "count",
         "dimensions": _dims("Bucket", "BatchSize")},
        # running sums, so a scraper gets per-request averages over any window
        {"name": "NeuronServeRequests", "unit": "count", "dimensions": _dims()},
        {"name": "NeuronServeTokenizeMs", "unit": "ms", "dimensions": _dims()},
        {"name": "NeuronServeModelMs", "unit": "ms", "dimensions": _dims()},
        {"name": "NeuronServeHandlerMs", "unit": "ms", "dimensions": _dims()},
    ],
    "gauge": [
        {"name": "NeuronServeBatchRequests", "unit": "count", "dimensions": _dims()},
        {"name": "NeuronServeTokenizeTime", "unit": "ms", "dimensions": _dims()},
        {"name": "NeuronServeModelTime", "unit": "ms", "dimensions": _dims()},
        {"name": "NeuronServePaddingRatio", "unit": "ratio", "dimensions": _dims()},
    ],
}


class PackagingError(RuntimeError):
    pass


def apply_layout(spec: DeploySpec, manifest) -> DeploySpec:
    """The spec with `layout: latency` turned into one worker holding every core of this
    host (throughput specs are returned as they are)."""
    if spec.layout != "latency":
        return spec
    kind = get_target(manifest.target).core_kind
    n = len(discover(kind, spec.neuron_cores))
    # model_copy skips validation: the validator forbids setting these by hand with latency
    return spec.model_copy(update={"workers": 1, "cores_per_worker": max(n, 1)})


def _plan_workers(spec: DeploySpec, manifest) -> tuple[int, int]:
    """(workers, core groups on this host) for the artifact's target.

    A worker of a module compiled for several NeuronCores (Inf1 pipeline mode) needs at
    least that many cores.
    """
    kind = get_target(manifest.target).core_kind
    per_module = int(manifest.compiler.get("cores_per_module", 1))
    if spec.cores_per_worker < per_module:
        raise PackagingError(
            f"the artifact was compiled for {per_module} NeuronCores per model (pipeline mode) "
            f"but cores_per_worker is {spec.cores_per_worker}: set cores_per_worker to "
            f"{per_module} or a multiple of it")
    try:
        groups = group_count(kind, spec.cores_per_worker, spec.neuron_cores)
    except NoFreeCoreGroup as e:
        if spec.workers:
            return spec.workers, spec.workers  # packaging on a build host for another host
        raise PackagingError(f"{e}; or pass --workers") from None
    return (spec.workers or groups), groups


def model_config(spec: DeploySpec, manifest, workers: int) -> dict:
    target = get_target(manifest.target)
    return {
        "minWorkers": workers,
        "maxWorkers": workers,
        "batchSize": spec.batch_requests or manifest.grid.max_batch,
        "maxBatchDelay": spec.max_batch_delay_ms,
        "responseTimeout": spec.response_timeout_s,
        # A worker that cannot start (no free core group) makes /ping say Unhealthy after
        # this long, instead of TorchServe retrying behind a Healthy /ping forever.
        "maxRetryTimeoutInSec": spec.worker_retry_timeout_s,
        "neuronserve": {
            "artifact": ARTIFACT_DIR,
            "core_kind": target.core_kind,
            "target": target.name,
            "cores_per_worker": spec.cores_per_worker,
            "neuron_cores": spec.neuron_cores,
            "truncation": spec.truncation,
        },
    }


def store_properties(spec: DeploySpec, store: Path) -> dict[str, str]:
    host = spec.bind_address
    return {
        "inference_address": f"http://{host}:{spec.inference_port}",
        "management_address": f"http://{host}:{spec.management_port}",
        "metrics_address": f"http://{host}:{spec.metrics_port}",
        "grpc_inference_port": str(spec.grpc_inference_port),
        "grpc_management_port": str(spec.grpc_management_port),
        "model_store": str(store),
        "load_models": "all",
        "metrics_mode": "prometheus",
        "metrics_config": str(store / METRICS_FILE),
        "disable_token_authorization": str(not spec.token_auth).lower(),
        "default_response_timeout": str(spec.response_timeout_s),
        "job_queue_size": "1000",
        "install_py_dep_per_model": "false",
    }


def write_properties(path: Path, props: dict[str, str]) -> None:
    lines = ["# written by neuronserve"] + [f"{k}={v}" for k, v in props.items()]
    path.write_text("\n".join(lines) + "\n")


def read_properties(path: Path) -> dict[str, str]:
    props = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            k, v = line.split("=", 1)
            props[k.strip()] = v.strip()
    return props


def _metrics_yaml(store: Path) -> None:
    import ts

    default = yaml.safe_load((Path(ts.__file__).parent / "configs" / METRICS_FILE).read_text())
    mm = default.setdefault("model_metrics", {})
    for kind, metrics in NEURONSERVE_METRICS.items():
        names = {m["name"] for m in mm.get(kind, [])}
        mm.setdefault(kind, []).extend(m for m in metrics if m["name"] not in names)
    (store / METRICS_FILE).write_text(yaml.safe_dump(default, sort_keys=False))


def package_torchserve(artifact: Path, spec: DeploySpec) -> Path:
    """Build the archive into the spec's model store; return its path."""
    artifact = Path(artifact)
    manifest = read_manifest(artifact)  # refuse a broken artifact before archiving it
    name = spec.name or manifest.name
    store = Path(spec.model_store).resolve()
    store.mkdir(parents=True, exist_ok=True)
    spec = apply_layout(spec, manifest)
    workers, groups = _plan_workers(spec, manifest)
    if workers > groups:
        print(f"warning: {workers} workers but this host has {groups} core group(s) of "
              f"{spec.cores_per_worker} core(s); workers beyond {groups} will fail to start "
              "unless the serving host has more cores")

    with tempfile.TemporaryDirectory(prefix="neuronserve-mar-") as tmp:
        tmp = Path(tmp)
        extra = tmp / "extra"
        extra.mkdir()
        # The archiver copies a directory's contents; a link named `artifact` in a staging
        # dir gives the archive an artifact/ folder without copying it here first.
        (extra / ARTIFACT_DIR).symlink_to(artifact.resolve(), target_is_directory=True)
        config = tmp / "model-config.yaml"
        config.write_text(yaml.safe_dump(model_config(spec, manifest, workers), sort_keys=False))
        for old in (store / f"{name}.mar", store / name):
            if old.is_dir():
                shutil.rmtree(old)
            elif old.exists():
                old.unlink()
        cmd = [
            *tool("torch-model-archiver", "model_archiver.model_packaging",
                  "generate_model_archive"),
            "--model-name", name, "--version", "1.0",
            "--handler", str(handler_file(HANDLER)),
            "--extra-files", str(extra),
            "--config-file", str(config),
            "--export-path", str(store),
            "--archive-format", spec.archive_format,
            "--force",
        ]
        # The archiver stages files under $TMPDIR/<name>: keep that inside our temp dir.
        env = {"TMPDIR": str(tmp)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(env))
        if proc.returncode != 0:
            raise PackagingError(f"torch-model-archiver failed:\n{proc.stdout}{proc.stderr}")

    _metrics_yaml(store)
    write_properties(store / CONFIG_FILE, store_properties(spec, store))
    out = store / (name if spec.archive_format == "no-archive" else f"{name}.mar")
    if not out.exists():
        raise PackagingError(f"torch-model-archiver reported success but {out} is missing")
    return out


def _env(extra: dict[str, str]) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.update(extra)
    return env
