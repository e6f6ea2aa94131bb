"""Triton Python-backend model shipped into every neuronserve model repository: a thin
adapter over the worker's Runners (one per model the deployment holds) in Triton's
initialize / execute / finalize shape.

initialize: `neuronserve.worker.start_worker` with the settings packaging wrote as
    `neuronserve_*` parameters: lease this instance's core group (its global index is
    the preferred one), pin, and only then import torch and load every model.
execute:    the batch Triton formed is split by model (the `model` request parameter,
    optional when the deployment holds one) and each model's requests go through one
    Runner call (`Worker.start`: waited on with one batch in flight, else answered
    through the requests' response senders when it ends); a bad request gets its own
    error while the others are answered. Its status is kept where Triton has a code
    for it (400, 404, 500, 503); any other (413 for over-long text with truncation off)
    travels in the message as "[413] ...".
finalize:   release the lease.

Inputs: IMAGE (BYTES, [n, 1]: encoded JPEG/PNG/WebP images) for image tasks; else
TEXT (BYTES, [n, 1]) and, for tasks taking pairs, TEXT_PAIR of the same shape
(rerank: the query in every TEXT row, a document per TEXT_PAIR row; question-answering:
the question and its context; required for those two); request parameters `truncate`
(bool) and `truncation_direction` ("right", "left") decide that request's over-long
texts, and the task's own parameters (aggregation_strategy, top_k, doc_stride, ...) shape
its per-text results. Outputs: the task's tensors (neuronserve.tensors).
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import sys
import time
from concurrent.futures import Future, wait

import triton_python_backend_utils as pb_utils


def instance_index(instance_name: str, model_config: dict) -> int:
    """The core group this instance prefers: the one its group is named after (`cores<k>`,
    one group per core group as `neuronserve package triton` writes them), else its
    global index across the config's groups (`<model>_<group>_<index>`, Triton's names)."""
    from neuronserve.worker import core_group_of

    named = core_group_of(instance_name)
    if named is not None:
        return named
    try:
        _, group, index = instance_name.rsplit("_", 2)
        group, index = int(group), int(index)
    except ValueError:
        return 0
    groups = model_config.get("instance_group", [])
    return sum(int(g.get("count", 1)) for g in groups[:group]) + index


# Triton's error codes and the HTTP status its server answers each with (http_server.cc,
# HttpCodeFromError); every other code is a 400.
TRITON_CODES = {404: "NOT_FOUND", 500: "INTERNAL", 501: "UNSUPPORTED", 503: "UNAVAILABLE"}


def error_code(error) -> tuple[str, str]:
    """(Triton error code name, message) keeping a RequestError's status as far as Triton
    can say it: in the code where it has one, else in the message's tag."""
    code_name = TRITON_CODES.get(error.status, "INVALID_ARG")
    return code_name, error.message if error.status in (400, *TRITON_CODES) else error.tagged()


def triton_error(error):
    code_name, message = error_code(error)
    code = getattr(pb_utils.TritonError, code_name, None)
    if code is None:  # older stubs have no error codes: Triton then answers 500
        return pb_utils.TritonError(message)
    return pb_utils.TritonError(message, code)


def parameters(model_config: dict) -> dict[str, str]:
    """The config's parameters as Triton hands them to `initialize` ({"string_value"})."""
    return {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}


def restore_pythonpath() -> None:
    """The stub ignores PYTHONPATH: a launcher that needs it (the tests' tritonserver,
    on a checkout) passes it as NEURONSERVE_PYTHONPATH."""
    extra = [p for p in os.environ.get("NEURONSERVE_PYTHONPATH", "").split(os.pathsep) if p]
    for path in reversed(extra):
        if path not in sys.path:
            sys.path.insert(0, path)


class _Batch:
    """A batch `execute` took: each request's (Runner, TaskRequest or its error), when it
    began, and requests served per model. (A plain class: Triton's stub loads this file
    under a name of its own, which a dataclass's annotations cannot be resolved in.)"""

    def __init__(self, parsed, t0, served):
        self.parsed, self.t0, self.served = parsed, t0, served


class TritonPythonModel:
    def initialize(self, args):
        restore_pythonpath()
        from neuronserve.worker import STACKS_SIGNAL, make_shared_memory_private

        # before any request reaches this instance: where tritonserver shares the host's
        # /dev/shm, the region requests come through is 0644 until made private here
        make_shared_memory_private()

        # every thread's stack on SIGUSR1, for a start that stalls (the stub's stderr
        # is the server log)
        faulthandler.register(STACKS_SIGNAL, all_threads=True)
        from neuronserve.worker import MODEL_PARAMETER, WorkerSettings, start_worker

        self.model_parameter = MODEL_PARAMETER
        config = json.loads(args["model_config"])
        self.model_name = config["name"]
        self.instance_name = args["model_instance_name"]
        index = instance_index(self.instance_name, config)
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        settings = WorkerSettings.from_parameters(parameters(config))
        # one batch at a time: `execute` waits for its answers (a batch answered later is
        # lost with the process if it dies: WorkerSection.batches_in_flight)
        self.wait = settings.batches_in_flight == 1
        self.worker = start_worker(
            settings,
            version_dir,
            owner=f"triton:{self.model_name}",
            prefer=index,
        )
        self.worker.lease.note(instance=self.instance_name, index=index)
        self._metrics = _Metrics(self.instance_name)
        pb_utils.Logger.log_info(f"neuronserve: {self.instance_name} {self.worker.describe()}")

    def execute(self, requests):
        from neuronserve.worker import RequestError

        t0 = time.perf_counter()
        parsed = []
        for request in requests:
            try:
                params = _parameters(request)
                model = params.pop(self.model_parameter, None)
                if model is not None and not isinstance(model, str):
                    raise RequestError(f'"{self.model_parameter}" must be a model name')
                runner = self.worker.runner(model)
                parsed.append((runner, self._parse(request, runner, params)))
            except RequestError as e:
                parsed.append((None, e))
        served = {}

        def report(model, run):
            served[model] = run.requests
            self._metrics.record(model, run)

        try:
            started = self.worker.start(parsed, report)
        except Exception as e:  # noqa: BLE001 - answered as the batch's 500s
            started = Future()
            started.set_exception(e)
        batch = _Batch(parsed, t0, served)
        if self.wait:
            wait([started])
        if started.done():  # served on this thread (CPU, or one batch at a time)
            return self._responses(batch, started)
        # a pipelined target: the batch runs on, and this instance takes the next one
        senders = [r.get_response_sender() for r in requests]
        started.add_done_callback(lambda f: self._send(senders, batch, f))
        return None

    def _responses(self, batch, started):
        """One response per request: its tensors, or its error."""
        from neuronserve.worker import RequestError, internal_error

        try:
            results = started.result()
        except Exception:  # noqa: BLE001 - every request of the batch gets its 500
            pb_utils.Logger.log_error(f"neuronserve: {self.instance_name} failed a batch")
            results = [internal_error("serving the batch")] * len(batch.parsed)
        responses = []
        for (runner, request), result in zip(batch.parsed, results, strict=True):
            try:
                if isinstance(result, RequestError):
                    raise result
                tensors = runner.tensors(request, result)
                outputs = [pb_utils.Tensor(name, arr) for name, arr in tensors.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            except Exception as e:  # noqa: BLE001 - this request fails, the others do not
                error = e if isinstance(e, RequestError) else internal_error("building the answer")
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[], error=triton_error(error))
                )
        self._metrics.handled((time.perf_counter() - batch.t0) * 1e3, batch.served)
        return responses

    def _send(self, senders, batch, started):
        """A batch answered after `execute` returned: each request's one response and
        the final flag, through its response sender (a non-decoupled model may answer
        so; Triton releases the request when `execute` returns and keeps its response
        factory until the final flag)."""
        from neuronserve.worker import internal_error

        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            responses = self._responses(batch, started)
        except Exception:  # noqa: BLE001 - no request may be left without its answer
            error = triton_error(internal_error("answering the batch"))
            responses = [pb_utils.InferenceResponse(output_tensors=[], error=error)] * len(senders)
        for sender, response in zip(senders, responses, strict=True):
            try:
                sender.send(response, flags=final)
            except Exception as e:  # noqa: BLE001 - the others are still answered
                pb_utils.Logger.log_error(f"neuronserve: a response was not sent: {e}")

    def _parse(self, request, runner, params):
        from neuronserve.worker import RequestError, TaskRequest, truncation_parameters

        task = runner.task
        if task.images:
            return TaskRequest(
                texts=_images(pb_utils.get_input_tensor_by_name(request, "IMAGE")),
                single=False,
                parameters=task.own_parameters(params),
            )
        texts = _texts(pb_utils.get_input_tensor_by_name(request, "TEXT"), "TEXT")
        if task.accepts_pairs:
            pair = pb_utils.get_input_tensor_by_name(request, "TEXT_PAIR")
            if pair is None and task.pairs_required:
                raise RequestError(f"task {task.name} needs TEXT_PAIR as well as TEXT")
            if pair is not None:
                seconds = _texts(pair, "TEXT_PAIR")
                if len(seconds) != len(texts):
                    raise RequestError(
                        f"TEXT has {len(texts)} texts but TEXT_PAIR has "
                        f"{len(seconds)}: send one pair text per text"
                    )
                texts = list(zip(texts, seconds, strict=True))
        truncate, direction = truncation_parameters(params)
        return TaskRequest(
            texts=texts,
            single=False,
            parameters=task.own_parameters(params),
            truncate=truncate,
            truncation_direction=direction,
        )

    def finalize(self):
        worker = getattr(self, "worker", None)
        if worker is not None:
            worker.stop()
        metrics = getattr(self, "_metrics", None)
        if metrics is not None:
            metrics.close()


# request parameters Triton's clients set themselves (tritonclient: binary_data_output when
# no output is named; KServe v2 sequence and scheduling fields), never a task's
TRITON_RESERVED = frozenset(
    {
        "binary_data_output",
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
    }
)


def _parameters(request) -> dict:
    """The request's parameters (KServe v2 `parameters`; the stub hands them over as
    JSON): truncation, and the task's own, which shape per-text results built here
    (entities, answers); a per-row task's (top_k of a classifier) shape the JSON answer
    neuronserve's front builds from the output tensors, and are checked here only."""
    from neuronserve.worker import RequestError

    raw = request.parameters() if hasattr(request, "parameters") else None
    try:
        params = json.loads(raw) if raw else {}
    except ValueError:
        raise RequestError("request parameters are not valid JSON") from None
    params = params if isinstance(params, dict) else {}
    return {k: v for k, v in params.items() if k not in TRITON_RESERVED}


def _images(tensor) -> list[bytes]:
    from neuronserve.worker import RequestError

    if tensor is None:
        raise RequestError("input IMAGE is missing")
    values = tensor.as_numpy().reshape(-1)
    if values.size == 0:
        raise RequestError("input IMAGE is empty: send at least one image")
    return [v if isinstance(v, bytes) else bytes(v) for v in values]


def _texts(tensor, name: str) -> list[str]:
    from neuronserve.worker import RequestError

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
    """`neuronserve.metrics` on Triton's metrics port, next to its nv_inference_*,
    labelled by the served model (`model`) and the instance."""

    def __init__(self, instance: str):
        from neuronserve.worker import METRICS, DeferredMetrics

        family = pb_utils.MetricFamily
        self.labels = {"instance": instance}
        # A family must outlive its metrics (the stub refuses to set a metric whose
        # family was collected), so both are kept.
        self.families = {
            m.name: family(
                name=m.snake_name,
                description=m.description,
                kind=family.COUNTER if m.kind == "counter" else family.GAUGE,
            )
            for m in METRICS
        }
        self._series = {}
        self.deferred = DeferredMetrics(self._emit)

    def _series_for(self, metric, labels):
        key = (metric.name, *sorted(labels.items()))
        if key not in self._series:
            self._series[key] = self.families[metric.name].Metric(labels={**self.labels, **labels})
        return self._series[key]

    def close(self) -> None:
        """The last values sent, then every metric and family let go here, while
        tritonserver still answers the stub: a metric's end is a message to it, which
        left to the collector at the stub's exit can wait on a server that is gone."""
        self.deferred.close()
        self._series.clear()
        self.families.clear()
        gc.collect()

    def record(self, model: str, report) -> None:
        """Each metric update is a message to the Triton process and its answer (the
        stub's message queue); DeferredMetrics sends them after the responses, many
        batches at once under load."""
        from neuronserve.worker import batch_values

        self.deferred.add(batch_values(report, model))

    def handled(self, handler_ms: float, requests: dict) -> None:
        from neuronserve.worker import handler_values

        self.deferred.add(handler_values(handler_ms, requests))

    def _emit(self, metric, value: float, labels: dict) -> None:
        series = self._series_for(metric, labels)
        if metric.kind == "counter":
            series.increment(value)
        else:
            series.set(value)
