"""package triton: artifact -> <repo>/<name>/{config.pbtxt, 1/model.py, 1/artifact/}.

config.pbtxt is built as Triton's own `ModelConfig` protobuf message (shipped with
tritonclient) and written with `text_format`: the schema, not a string template,
decides what a valid config is. Batch sizes come from the artifact's grid and the
instance count from the worker plan, so Triton never forms a batch the grid cannot
hold and never starts more instances than there are core groups.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from .. import placement
from ..buckets import engine_batch_sizes
from ..resources import triton_model_file
from ..spec import DeploySpec
from ..tasks import get_task
from ..worker import ARTIFACT_DIR
from .model import PackagedModel, prepare, put_in_place, staged

CONFIG = "config.pbtxt"

_DTYPES = {"float32": "TYPE_FP32", "bytes": "TYPE_STRING", "int64": "TYPE_INT64"}


def model_config(spec: DeploySpec, packaged: PackagedModel) -> Any:
    """The ModelConfig message for one neuronserve model."""
    from tritonclient.grpc import model_config_pb2 as mc

    manifest = packaged.manifest
    task = get_task(manifest.task)
    grid = manifest.grid
    config = mc.ModelConfig(name=packaged.name, backend="python", max_batch_size=grid.max_batch)
    # One text per batch row: Triton's batch dimension counts texts, so its dynamic
    # batcher fills exactly the compiled batch sizes. TEXT_PAIR: the document of a rerank
    # row, the context of a question (required there), a classifier's optional pair.
    # (an image task's rows are IMAGE: one encoded image, JPEG/PNG/WebP bytes, per row)
    config.input.append(mc.ModelInput(name=task.input_tensor, data_type=mc.TYPE_STRING, dims=[1]))
    if task.accepts_pairs:
        config.input.append(
            mc.ModelInput(
                name="TEXT_PAIR",
                data_type=mc.TYPE_STRING,
                dims=[1],
                optional=not task.pairs_required,
            )
        )
    for t in task.output_tensors(manifest.output_dim, manifest.labels):
        config.output.append(
            mc.ModelOutput(
                name=t.name, data_type=mc.DataType.Value(_DTYPES[t.dtype]), dims=list(t.dims)
            )
        )
    # max_batch_size stays the grid's (it also bounds the texts of one request); the
    # batches Triton aims for are those the bucket times say are worth forming
    config.dynamic_batching.preferred_batch_size.extend(
        engine_batch_sizes(grid, manifest.bucket_ms)
    )
    config.dynamic_batching.max_queue_delay_microseconds = spec.max_batch_delay_ms * 1000
    # bounded: beyond max_queued (or after queue_timeout_ms waiting) Triton refuses the
    # request (UNAVAILABLE, HTTP 503) instead of letting latency grow without bound
    policy = config.dynamic_batching.default_queue_policy
    policy.max_queue_size = spec.max_queued
    policy.timeout_action = mc.ModelQueuePolicy.REJECT
    if spec.queue_timeout_ms:
        policy.default_timeout_microseconds = spec.queue_timeout_ms * 1000
    config.instance_group.append(
        mc.ModelInstanceGroup(count=packaged.plan.workers, kind=mc.ModelInstanceGroup.KIND_CPU)
    )
    for key, value in packaged.settings.triton_parameters().items():
        config.parameters[key].string_value = value
    return config


def write_config(path: Path, config: Any) -> None:
    path.write_text(text_format.MessageToString(config))


def read_config(path: Path) -> Any:
    from tritonclient.grpc import model_config_pb2 as mc

    return text_format.Parse(Path(path).read_text(), mc.ModelConfig())


def package_triton(
    artifact: Path, spec: DeploySpec, plan: placement.WorkerPlan | None = None
) -> Path:
    """Write the model into the spec's Triton repository (for `plan`, or this host's);
    return the model directory."""
    artifact = Path(artifact)
    packaged = prepare(artifact, spec, what="instances", plan=plan)
    repository = Path(spec.triton_repository)
    with staged(repository) as stage:
        model_dir = stage / packaged.name
        version = model_dir / "1"
        version.mkdir(parents=True)
        shutil.copy2(triton_model_file(), version / "model.py")
        shutil.copytree(artifact, version / ARTIFACT_DIR)
        write_config(model_dir / CONFIG, model_config(spec, packaged))
        return put_in_place(model_dir, repository)
