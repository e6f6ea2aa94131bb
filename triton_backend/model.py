"""Triton Python-backend model shipped into every neuronserve model repository: a thin
adapter over Runner in Triton's initialize / execute / finalize shape.

initialize: derive this instance's global index, lease that core group (the same lease
    code TorchServe workers use), pin, and only then import torch and load the artifact.
execute: every request of the batch Triton formed goes through one Runner call; a bad
    request gets its own TritonError while the others are answered.
finalize: release the lease.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import triton_python_backend_utils as pb_utils

PARAM_PREFIX = "neuronserve_"


def instance_index(instance_name: str, model_config: dict) -> int:
    """Global index of `<model>_<group>_<index>` across the config's instance groups."""
    try:
        _, group, index = instance_name.rsplit("_", 2)
        group, index = int(group), int(index)
    except ValueError:
        return 0
    groups = model_config.get("instance_group", [])
    return sum(int(g.get("count", 1)) for g in groups[:group]) + index


def parameters(model_config: dict) -> dict[str, str]:
    return {k[len(PARAM_PREFIX):]: v["string_value"]
            for k, v in model_config.get("parameters", {}).items() if k.startswith(PARAM_PREFIX)}


def _error(message: str):
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    if code is None:  # older stubs have no error codes: Triton then answers 500
        return pb_utils.TritonError(message)
    return pb_utils.TritonError(message, code)


def restore_pythonpath() -> None:
    """The stub ignores PYTHONPATH; `neuronserve serve triton` passes it on here."""
    extra = [p for p in os.environ.get("NEURONSERVE_PYTHONPATH", "").split(os.pathsep) if p]
    for path in reversed(extra):
        if path not in sys.path:
            sys.path.insert(0, path)


class TritonPythonModel:
    def initialize(self, args):
        restore_pythonpath()
        from neuronserve import cores

        config = json.loads(args["model_config"])
        params = parameters(config)
        self.model_name = config["name"]
        self.instance_name = args["model_instance_name"]
        index = instance_index(self.instance_name, config)
        neuron_cores = params.get("neuron_cores")
        self.lease = cores.claim(params.get("core_kind", "cpu"),
                                 int(params.get("cores_per_instance", "1")),
                                 owner=f"triton:{self.instance_name}", prefer=index,
                                 neuron_cores=int(neuron_cores) if neuron_cores else None)
        # Pinning (thread counts and affinity, or NEURON_RT_VISIBLE_CORES) happens before
        # torch or the Neuron SDK is imported in this process.
        cores.pin(self.lease, target=params.get("target"))
        self.lease.note(instance=self.instance_name, index=index)

        from neuronserve.runtime import Runner

        artifact = Path(args["model_repository"]) / args["model_version"] / params["artifact"]
        truncation = params.get("truncation")
        self.runner = Runner(artifact, truncation=None if truncation is None
                             else truncation == "true")
        self.pairs = self.runner.task.accepts_pairs
        self._metrics = _Metrics(self.model_name, self.instance_name)
        pb_utils.Logger.log_info(
            f"neuronserve: {self.instance_name} (pid {os.getpid()}) leased core group "
            f"{self.lease.group.index} (cores {self.lease.group.label}); buckets warmed up")

    def execute(self, requests):
        from neuronserve.runtime import RunReport
        from neuronserve.tasks import RequestError

        parsed = []
        for request in requests:
            try:
                parsed.append(self._parse(request))
            except RequestError as e:
                parsed.append(e)
        report = RunReport()
        responses = []
        for result in self.runner.infer(parsed, report):
            if isinstance(result, RequestError):
                responses.append(pb_utils.InferenceResponse(output_tensors=[],
                                                            error=_error(result.message)))
                continue
            tensors = self.runner.task.tensors(result, self.runner.info)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(name, arr) for name, arr in tensors.items()]))
        self._metrics.record(report)
        return responses

    def _parse(self, request):
        from neuronserve.tasks import RequestError, TaskRequest

        texts = _texts(pb_utils.get_input_tensor_by_name(request, "TEXT"), "TEXT")
        if self.pairs:
            pair = pb_utils.get_input_tensor_by_name(request, "TEXT_PAIR")
            if pair is not None:
                seconds = _texts(pair, "TEXT_PAIR")
                if len(seconds) != len(texts):
                    raise RequestError(f"TEXT has {len(texts)} texts but TEXT_PAIR has "
                                       f"{len(seconds)}: send one pair text per text")
                texts = list(zip(texts, seconds, strict=True))
        return TaskRequest(texts=texts, single=False)

    def finalize(self):
        lease = getattr(self, "lease", None)
        if lease is not None:
            lease.release()


def _texts(tensor, name: str) -> list[str]:
    from neuronserve.tasks import RequestError

    if tensor is None:
        raise RequestError(f"input {name} is missing")
    values = tensor.as_numpy().reshape(-1)
    if values.size == 0:
        raise RequestError(f"input {name} is empty: send at least one text")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, str):
            out.append(v)
            continue
        if not isinstance(v, bytes):
            raise RequestError(f"{name}[{i}] must be BYTES text, got {type(v).__name__}")
        try:
            out.append(v.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise RequestError(f"{name}[{i}] is not valid UTF-8 text: {e}") from None
    return out


class _Metrics:
    """neuronserve's metrics on Triton's metrics port, next to its nv_inference_*."""

    def __init__(self, model: str, instance: str):
        family = pb_utils.MetricFamily
        self.labels = {"model": model, "instance": instance}
        self.bucket_runs = family(name="neuronserve_bucket_runs",
                                  description="bucket runs, by bucket and rows in it",
                                  kind=family.COUNTER)
        # A family must outlive its metrics (the stub refuses to set a metric whose
        # family was collected), so both are kept.
        self.families = {
            key: family(name=f"neuronserve_{key}", description=desc, kind=family.GAUGE)
            for key, desc in (
                ("batch_requests", "requests in the last batch"),
                ("padding_ratio", "padded tokens per real token in the last batch"),
                ("tokenize_ms", "tokenization time of the last batch (ms)"),
                ("model_ms", "model time of the last batch (ms)"),
            )
        }
        self.gauges = {k: f.Metric(labels=self.labels) for k, f in self.families.items()}
        self._runs = {}

    def record(self, report) -> None:
        self.gauges["batch_requests"].set(report.requests)
        self.gauges["tokenize_ms"].set(report.tokenize_ms)
        if report.runs:
            self.gauges["model_ms"].set(report.model_ms)
            self.gauges["padding_ratio"].set(report.padding_ratio)
        for run in report.runs:
            key = (run.bucket.key, run.rows)
            if key not in self._runs:
                self._runs[key] = self.bucket_runs.Metric(labels={
                    **self.labels, "bucket": run.bucket.key, "batch_size": str(run.rows)})
            self._runs[key].increment(1)
