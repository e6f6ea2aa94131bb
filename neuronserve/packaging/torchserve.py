"""package torchserve: artifacts -> <store>/<name>.mar, model-config.yaml, config.properties.

The archive holds the handler from `handlers/` and each artifact under `models/<name>/`:
one TorchServe model whose workers (one per core group) each load every model. It is
named after its model when it holds one, else after the spec's `deployment_name`, and a
request names its model in the X-Neuronserve-Model header. Its model-config.yaml is
written by `model_config`. The store's config.properties puts every endpoint on the
spec's address (loopback by default) with token authorization.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import zipfile
from pathlib import Path

import yaml

from .. import metrics
from ..resources import package_file, tool
from ..sources import FoundModel, ModelSourceError, UnpackLimits
from ..spec import LimitsSection, TorchServeSection, WorkerSection
from ..worker import MODELS_DIR, WorkerSettings
from .model import (
    MULTI_MODEL_MAX_BATCH,
    Packaged,
    PackagingError,
    engine_batches,
    found_in,
    put_in_place,
    retire,
    staged,
)

__all__ = ["PackagingError", "model_config", "package_torchserve"]

HANDLER = "neuronserve_handler.py"
MODEL_CONFIG = "model-config.yaml"  # in the archive, beside the handler
CONFIG_FILE = "config.properties"
METRICS_FILE = "metrics.yaml"


def _metric_declarations() -> dict[str, list[dict]]:
    """neuronserve.metrics as TorchServe's metrics.yaml declares model metrics, so its
    prometheus endpoint exports them. Each gets its own dimension list: a shared one would
    be written as a YAML alias, and TorchServe's frontend appends Hostname to the aliased
    list once per metric."""
    out: dict[str, list[dict]] = {"counter": [], "gauge": []}
    for m in metrics.METRICS:
        out[m.kind].append(
            {
                "name": m.camel_name,
                "unit": m.unit,
                "dimensions": [
                    "ModelName",
                    "Level",
                    metrics.MODEL_LABEL,
                    *(metrics.camel(label) for label in m.labels),
                ],
            }
        )
    return out


def model_config(own: TorchServeSection, packaged: Packaged) -> dict:
    """The archive's model-config.yaml: workers = the plan, batchSize = the largest batch
    worth forming by the artifacts' bucket times (never beyond a grid, so a batch of
    one-text requests fits one bucket run of the model that takes the most), and the
    worker settings the handler reads back."""
    return {
        "minWorkers": packaged.plan.workers,
        "maxWorkers": packaged.plan.workers,
        "batchSize": own.batch_requests
        or max(
            (max(engine_batches(m.manifest)) for m in packaged.models),
            default=MULTI_MODEL_MAX_BATCH,
        ),
        # 0 in model-config.yaml is read as unset (100 ms), and 0 through config.properties
        # ends every batch at two requests (its aggregator stops once the delay is spent):
        # 1 ms is the least delay that still batches (Model.pollBatch, ModelManager)
        "maxBatchDelay": max(1, packaged.worker.max_batch_delay_ms),
        "responseTimeout": packaged.worker.response_timeout_s,
        # A worker that cannot start (no free core group) makes /ping say Unhealthy after
        # this long, instead of TorchServe retrying behind a Healthy /ping forever.
        "maxRetryTimeoutInSec": own.worker_retry_timeout_s,
        # bounded: a request beyond the queue is refused (503) at once
        "jobQueueSize": packaged.worker.max_queued,
        **(
            {"clientTimeoutInMills": timeout}
            if (timeout := packaged.worker.queue_timeout_ms)
            else {}
        ),
        **packaged.settings.as_section(),
    }


def packaged_models(source: Path, work: Path) -> list[FoundModel] | None:
    """The models of a TorchServe store in `source`: its first .mar (the models and their
    settings unpacked into `work`, within bounds), or a folder one was unpacked into
    (--archive-format no-archive); None when `source` holds neither."""
    mars = sorted(source.glob("*.mar"))
    if mars:
        out = work / "from-mar"
        with zipfile.ZipFile(mars[0]) as z:
            members = [n for n in z.namelist() if n.startswith(f"{MODELS_DIR}/")]
            if not members:
                raise ModelSourceError(f"{mars[0]} holds no neuronserve {MODELS_DIR}/ folder")
            wanted = [*members, MODEL_CONFIG]
            # zipfile stops each member at its declared size: the declared total is what
            # extraction can write, checked before anything is
            total = sum(z.getinfo(n).file_size for n in wanted if n in z.NameToInfo)
            UnpackLimits(mars[0].stat().st_size, work).check(mars[0].name, len(wanted), total)
            z.extractall(out, wanted)
        return found_in(out, _settings(out / MODEL_CONFIG))
    for config in sorted(source.glob(f"*/{MODEL_CONFIG}")):
        return found_in(config.parent, _settings(config))
    return None


def _settings(path: Path) -> WorkerSettings:
    return WorkerSettings.from_section(yaml.safe_load(path.read_text()))


def store_properties(
    own: TorchServeSection, worker: WorkerSection, limits: LimitsSection, store: Path
) -> dict[str, str]:
    host = own.bind_address
    return {
        "inference_address": f"http://{host}:{own.inference_port}",
        "management_address": f"http://{host}:{own.management_port}",
        "metrics_address": f"http://{host}:{own.metrics_port}",
        "grpc_inference_port": str(own.grpc_inference_port),
        "grpc_management_port": str(own.grpc_management_port),
        "model_store": str(store),
        "load_models": "all",
        "metrics_mode": "prometheus",
        # TorchServe's host metrics run a Python process every minute (about a second of
        # CPU on the cores the workers serve on: a latency spike a minute); the front and
        # the handler's own metrics say what serving needs
        "disable_system_metrics": "true",
        "metrics_config": str(store / METRICS_FILE),
        "disable_token_authorization": str(not own.token_auth).lower(),
        "token_expiration_min": str(own.token_expiration_min),
        "default_response_timeout": str(worker.response_timeout_s),
        "job_queue_size": str(worker.max_queued),
        "install_py_dep_per_model": "false",
        # the spec's body limit, the same as the front's; an answer TorchServe cannot take
        # kills the worker that sent it (its frame decoder refuses it), so this is above
        # the largest answer a worker lets out (max_answer_bytes, and the error in its place)
        "max_request_size": str(limits.max_body_bytes),
        "max_response_size": str(max(6_553_500, limits.max_answer_bytes + 2**20)),
        # models and workflows load from this store only, never from a URL
        "allowed_urls": "file://" + re.escape(str(store)) + "/.*",
        "workflow_store": str(store),
    }


def write_properties(path: Path, props: dict[str, str]) -> None:
    for k, v in props.items():
        # a value holding a line break would add a property of its own
        if any(c in f"{k}{v}" for c in "\r\n"):
            raise PackagingError(f"config.properties value of {k} holds a line break: {v!r}")
    # java.util.Properties reads a backslash as an escape (allowed_urls is a regex)
    lines = ["# written by neuronserve"] + [
        f"{k}={v.replace(chr(92), chr(92) * 2)}" for k, v in props.items()
    ]
    path.write_text("\n".join(lines) + "\n")


def read_properties(path: Path) -> dict[str, str]:
    props = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            k, v = line.split("=", 1)
            props[k.strip()] = v.strip().replace(chr(92) * 2, chr(92))
    return props


def _metrics_yaml(store: Path) -> None:
    import ts

    default = yaml.safe_load((Path(ts.__file__).parent / "configs" / METRICS_FILE).read_text())
    mm = default.setdefault("model_metrics", {})
    for kind, declared in _metric_declarations().items():
        names = {m["name"] for m in mm.get(kind, [])}
        mm.setdefault(kind, []).extend(m for m in declared if m["name"] not in names)
    (store / METRICS_FILE).write_text(yaml.safe_dump(default, sort_keys=False))


def package_torchserve(own: TorchServeSection, packaged: Packaged) -> Path:
    """Build the archive of the prepared models into the model store `own` names;
    return its path."""
    name = packaged.name
    store = Path(own.model_store).resolve()
    store.mkdir(parents=True, exist_ok=True)

    made = f"{name}.mar" if own.archive_format != "no-archive" else name
    with tempfile.TemporaryDirectory(prefix="neuronserve-mar-") as tmp_name, staged(store) as stage:
        tmp = Path(tmp_name)
        extra = tmp / "extra"
        (extra / MODELS_DIR).mkdir(parents=True)
        # The archiver copies a directory's contents; links in a staging dir give the
        # archive a models/<name>/ folder per artifact without copying them here first.
        for m in packaged.models:
            (extra / m.folder).symlink_to(m.artifact.resolve(), target_is_directory=True)
        config = tmp / MODEL_CONFIG
        config.write_text(yaml.safe_dump(model_config(own, packaged), sort_keys=False))
        cmd = [
            *tool(
                "torch-model-archiver", "model_archiver.model_packaging", "generate_model_archive"
            ),
            "--model-name",
            name,
            "--version",
            "1.0",
            "--handler",
            str(package_file("neuronserve._handlers", HANDLER)),
            "--extra-files",
            str(extra),
            "--config-file",
            str(config),
            "--export-path",
            str(stage),
            "--archive-format",
            own.archive_format,
            "--force",
        ]
        # The archiver stages files under $TMPDIR/<name>: keep that inside our temp dir.
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp)}
        )
        if proc.returncode != 0:
            raise PackagingError(f"torch-model-archiver failed:\n{proc.stdout}{proc.stderr}")
        if not (stage / made).exists():
            raise PackagingError(f"torch-model-archiver reported success but wrote no {made}")
        # the other format of the same model, from an earlier packaging, would load twice
        retire(store, name if made != name else f"{name}.mar", stage)
        out = put_in_place(stage / made, store)

    _metrics_yaml(store)
    # the paths TorchServe reads are where it will find the store (KServe mounts it
    # elsewhere): the folder written unless the section says where it is served from
    where = Path(own.served_from) if own.served_from is not None else store
    if not where.is_absolute():
        raise PackagingError(f"served_from {where}: give the absolute folder TorchServe reads")
    write_properties(
        store / CONFIG_FILE, store_properties(own, packaged.worker, packaged.limits, where)
    )
    return out
