"""package triton: artifacts -> <repo>/<name>/{config.pbtxt, 1/model.py, 1/models/<model>/}.

One Triton model holds every model of the deployment (named after its model when it
holds one, else after the spec's `deployment_name`); its instances, one per core group,
each load them all, and a request names its model in the `model` request parameter.

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

from .. import tensors
from ..resources import package_file
from ..sources import FoundModel
from ..spec import TritonSection
from ..tasks import TASKS, get_task
from ..worker import WorkerSettings, core_group_name
from .model import (
    MULTI_MODEL_MAX_BATCH,
    Packaged,
    PackagingError,
    engine_batches,
    found_in,
    put_in_place,
    staged,
)

CONFIG = "config.pbtxt"
# the Python-backend model every instance runs (triton_backend/model.py)
MODEL_PY = "model.py"

_DTYPES = {
    "float32": "TYPE_FP32",
    "bytes": "TYPE_STRING",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
}


def model_config(packaged: Packaged) -> Any:
    """The ModelConfig message of a deployment: one Triton model holding every model
    (named after its model when it holds one), whose inputs and outputs are those its
    models' tasks take and give."""
    from tritonclient.grpc import model_config_pb2 as mc

    config = mc.ModelConfig(
        name=packaged.name,
        backend="python",
        max_batch_size=max(
            (max(m.manifest.grid.max_batch, *engine_batches(m.manifest)) for m in packaged.models),
            default=MULTI_MODEL_MAX_BATCH,
        ),
    )
    # One text per batch row: Triton's batch dimension counts texts, so its dynamic
    # batcher fills exactly the compiled batch sizes. TEXT_PAIR: the document of a rerank
    # row, the context of a question (required there), a classifier's optional pair.
    # (an image task's rows are IMAGE: one encoded image, JPEG/PNG/WebP bytes, per row)
    for name, required in _inputs(packaged).items():
        config.input.append(
            mc.ModelInput(name=name, data_type=mc.TYPE_STRING, dims=[1], optional=not required)
        )
    for name, (dtype, dims) in _outputs(packaged).items():
        config.output.append(
            mc.ModelOutput(name=name, data_type=mc.DataType.Value(_DTYPES[dtype]), dims=dims)
        )
    # max_batch_size is the largest grid's (the worker splits a model's batch beyond its
    # own); the batches Triton aims for are those the bucket times say are worth forming
    preferred = {size for m in packaged.models for size in engine_batches(m.manifest)}
    config.dynamic_batching.preferred_batch_size.extend(sorted(preferred))
    config.dynamic_batching.max_queue_delay_microseconds = packaged.worker.max_batch_delay_ms * 1000
    # bounded: beyond max_queued (or after queue_timeout_ms waiting) Triton refuses the
    # request (UNAVAILABLE, HTTP 503) instead of letting latency grow without bound
    policy = config.dynamic_batching.default_queue_policy
    policy.max_queue_size = packaged.worker.max_queued
    policy.timeout_action = mc.ModelQueuePolicy.REJECT
    if packaged.worker.queue_timeout_ms:
        policy.default_timeout_microseconds = packaged.worker.queue_timeout_ms * 1000
    # one group per core group, so that one dead instance can be replaced alone
    for index in range(packaged.plan.workers):
        # an instance group per core group, with a host policy of its own: Triton's
        # in-place instance update tells instances apart by their group's settings, not
        # by the group's name
        name = policy = core_group_name(index)
        config.instance_group.append(
            mc.ModelInstanceGroup(
                name=name, count=1, kind=mc.ModelInstanceGroup.KIND_CPU, host_policy=policy
            )
        )
    for key, value in packaged.settings.as_parameters().items():
        config.parameters[key].string_value = value
    return config


def _multi_model_tensors() -> tuple[dict[str, bool], dict[str, tuple[str, list[int]]]]:
    """A multi-model deployment's inputs and outputs: any task's (each optional, sizes
    variable), since the models it will load are not known when Triton reads the config."""
    inputs: dict[str, bool] = {}
    outputs: dict[str, tuple[str, list[int]]] = {}
    for name in TASKS:
        task = get_task(name)
        inputs[tensors.input_name(name)] = False
        if task.accepts_pairs:
            inputs[tensors.PAIR_INPUT] = False
        for t in tensors.of(name).outputs(2, ["a", "b"]):
            seen = outputs.get(t.name)
            if seen is not None and seen[0] != t.dtype:
                raise PackagingError(f"output {t.name} is {seen[0]} and {t.dtype} in two tasks")
            outputs[t.name] = (t.dtype, [-1] * len(t.dims))
    return inputs, outputs


def _inputs(packaged: Packaged) -> dict[str, bool]:
    """Input name -> required: required only when every model's requests carry it."""
    if not packaged.models:
        return _multi_model_tensors()[0]
    needs: list[dict[str, bool]] = []
    for m in packaged.models:
        task = get_task(m.manifest.task)
        own = {tensors.input_name(task.name): True}
        if task.accepts_pairs:
            own[tensors.PAIR_INPUT] = task.pairs_required
        needs.append(own)
    names = list(dict.fromkeys(n for own in needs for n in own))
    return {n: all(own.get(n, False) for own in needs) for n in names}


def _outputs(packaged: Packaged) -> dict[str, tuple[str, list[int]]]:
    """Output name -> (dtype, dims per text); a name two models give at other sizes (two
    embedders of other widths) is declared variable (-1)."""
    if not packaged.models:
        return _multi_model_tensors()[1]
    out: dict[str, tuple[str, list[int]]] = {}
    for m in packaged.models:
        for t in tensors.of(m.manifest.task).outputs(m.manifest.output_dim, m.manifest.labels):
            dims = list(t.dims)
            if t.name in out:
                dtype, seen = out[t.name]
                if dtype != t.dtype:
                    raise PackagingError(
                        f"output {t.name} is {dtype} for one model and {t.dtype} for {m.name}"
                    )
                dims = seen if seen == dims else [-1] * len(dims)
            out[t.name] = (t.dtype, dims)
    return out


def write_config(path: Path, config: Any) -> None:
    path.write_text(text_format.MessageToString(config))


def read_config(path: Path) -> Any:
    from tritonclient.grpc import model_config_pb2 as mc

    return text_format.Parse(Path(path).read_text(), mc.ModelConfig())


def packaged_models(source: Path) -> list[FoundModel] | None:
    """The models of a Triton repository in `source` (`<repo>/<name>/1/model.py`), with
    the settings its config.pbtxt carries; None when `source` holds none."""
    from google.protobuf import json_format

    for model_py in sorted(source.glob(f"*/*/{MODEL_PY}")):
        config = read_config(model_py.parents[1] / CONFIG)
        params = json_format.MessageToDict(config, preserving_proto_field_name=True)
        strings = {k: v["string_value"] for k, v in params.get("parameters", {}).items()}
        return found_in(model_py.parent, WorkerSettings.from_parameters(strings))
    return None


def package_triton(own: TritonSection, packaged: Packaged) -> Path:
    """Write the prepared models into the Triton repository `own` names as one Triton
    model; return the model directory."""
    repository = own.repository
    with staged(repository) as stage:
        model_dir = stage / packaged.name
        version = model_dir / "1"
        version.mkdir(parents=True)
        shutil.copy2(package_file("neuronserve._triton_backend", MODEL_PY), version / MODEL_PY)
        for m in packaged.models:
            shutil.copytree(m.artifact, version / m.folder)
        write_config(model_dir / CONFIG, model_config(packaged))
        return put_in_place(model_dir, repository)
