"""package triton: artifact -> <repo>/<name>/{config.pbtxt, 1/model.py, 1/artifact/}.

config.pbtxt is built as Triton's own `ModelConfig` protobuf message (shipped with
tritonclient) and written with `text_format`: the schema, not a string template,
decides what a valid config is. Batch sizes and instance counts come from the
artifact's grid and the core plan, so Triton never forms a batch the grid cannot hold
and never starts more instances than there are core groups.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from google.protobuf import text_format

from ..artifact import Manifest, read_manifest
from ..compile import get_target
from ..spec import DeploySpec
from ..tasks import get_task
from .torchserve import _plan_workers, apply_layout

CONFIG = "config.pbtxt"
ARTIFACT_DIR = "artifact"
PARAM_PREFIX = "neuronserve_"  # read back by triton_backend/model.py

_DTYPES = {"float32": "TYPE_FP32", "bytes": "TYPE_STRING", "int64": "TYPE_INT64"}


def model_config(manifest: Manifest, spec: DeploySpec, name: str, instances: int):
    """The ModelConfig message for one neuronserve model."""
    from tritonclient.grpc import model_config_pb2 as mc

    task = get_task(manifest.task)
    target = get_target(manifest.target)
    grid = manifest.grid
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=grid.max_batch)
    # One text per batch row: Triton's batch dimension counts texts, so its dynamic
    # batcher fills exactly the compiled batch sizes.
    config.input.append(mc.ModelInput(name="TEXT", data_type=mc.TYPE_STRING, dims=[1]))
    if task.accepts_pairs:
        config.input.append(mc.ModelInput(name="TEXT_PAIR", data_type=mc.TYPE_STRING,
                                          dims=[1], optional=True))
    for t in task.output_tensors(manifest.output_dim, manifest.labels):
        config.output.append(mc.ModelOutput(name=t.name, data_type=mc.DataType.Value(
            _DTYPES[t.dtype]), dims=list(t.dims)))
    config.dynamic_batching.preferred_batch_size.extend(grid.batch_sizes)
    config.dynamic_batching.max_queue_delay_microseconds = spec.max_batch_delay_ms * 1000
    config.instance_group.append(mc.ModelInstanceGroup(count=instances,
                                                       kind=mc.ModelInstanceGroup.KIND_CPU))
    params = {
        "artifact": ARTIFACT_DIR,
        "core_kind": target.core_kind,
        "target": target.name,
        "cores_per_instance": str(spec.cores_per_worker),
        "truncation": str(spec.truncation).lower(),
    }
    if spec.neuron_cores:
        params["neuron_cores"] = str(spec.neuron_cores)
    for key, value in params.items():
        config.parameters[PARAM_PREFIX + key].string_value = value
    return config


def write_config(path: Path, config) -> None:
    path.write_text(text_format.MessageToString(config))


def read_config(path: Path):
    from tritonclient.grpc import model_config_pb2 as mc

    return text_format.Parse(Path(path).read_text(), mc.ModelConfig())


def package_triton(artifact: Path, spec: DeploySpec) -> Path:
    """Write the model into the spec's Triton repository; return the model directory."""
    from ..resources import triton_model_file

    artifact = Path(artifact)
    manifest = read_manifest(artifact)
    name = spec.name or manifest.name
    spec = apply_layout(spec, manifest)
    instances, groups = _plan_workers(spec, manifest)
    if instances > groups:
        print(f"warning: {instances} instances but this host has {groups} core group(s) of "
              f"{spec.cores_per_worker} core(s); instances beyond {groups} will fail to start "
              "unless the serving host has more cores")
    model_dir = Path(spec.triton_repository) / name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    version = model_dir / "1"
    version.mkdir(parents=True)
    shutil.copy2(triton_model_file(), version / "model.py")
    shutil.copytree(artifact, version / ARTIFACT_DIR)
    write_config(model_dir / CONFIG, model_config(manifest, spec, name, instances))
    return model_dir
