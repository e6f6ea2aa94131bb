"""TorchServe handler shipped inside every neuronserve .mar: a thin adapter over the
worker's Runners (one per model the archive holds).

initialize:  `neuronserve.worker.start_worker` with the settings packaging wrote into the
             archive's model-config.yaml: lease a core group, pin, load and warm up every
             model on it.
handle:      one batch TorchServe formed, answered in place:
  _parse:    TorchServe request rows -> (its model's Runner, parsed request); the model is
             the one the X-Neuronserve-Model header names (optional when the archive
             holds one); bad requests become errors in place.
  start:     `Worker.start`, waited on: one Runner call per model for the batch.
  _answer:   per request, the task's JSON and the HTTP status (a RequestError keeps its
             own: 400, 404, 413, 500).
             The batch's metrics (`neuronserve.metrics`, labelled by model) are written
             by a thread of their own once the response has gone.

Every batch's state is its own: nothing of a request is kept on the handler.

Everything else (decoding, tokenizing, bucketing, padding, running, unpadding, task
output) is the Runner's, shared with Triton.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import time
from http import HTTPStatus

import orjson
from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes

from neuronserve.worker import MODEL_HEADER

logger = logging.getLogger(__name__)
# seconds into a worker's start after which every thread's stack is written to its log
START_STALL_S = 120


# Not TorchServe's BaseHandler (TorchServe takes any class with initialize and handle):
# importing its module imports what these workers never use (torch.compile's OpenVINO
# backend, torch_xla where installed), seconds of every worker's start and replacement
# before it has leased its cores, and its initialize picks a device and loads model.pt
# itself, where the Runner keeps inputs on the host and loads what the manifest describes.
class NeuronServeHandler:
    def __init__(self):
        self.initialized = False

    def initialize(self, context):
        from neuronserve.worker import FAILURE_MARKER, WorkerSettings, start_worker

        self.context = context
        self.manifest = context.manifest
        # a start that stalls says where, in the worker's log (TorchServe's model_log)
        with contextlib.suppress(ValueError, OSError, RuntimeError):  # stderr without a file
            faulthandler.dump_traceback_later(START_STALL_S)
        try:
            settings = WorkerSettings.from_section(getattr(context, "model_yaml_config", None))
            self.worker = start_worker(
                settings,
                context.system_properties["model_dir"],
                owner=f"torchserve:{context.model_name}",
            )
        except Exception as e:
            # One line with this marker is what `neuronserve serve` reports instead of
            # waiting for a worker that will never be READY.
            logger.error("%s %s", FAILURE_MARKER, " | ".join(str(e).splitlines()))
            raise
        finally:
            faulthandler.cancel_dump_traceback_later()
        from neuronserve.worker import DeferredMetrics

        self.metrics = DeferredMetrics(self._add)
        self.initialized = True
        logger.info("neuronserve: %s", self.worker.describe())

    def handle(self, data, context):
        """TorchServe's entry point: the batch's answers, in its order."""
        from neuronserve.worker import batch_values, handler_values

        # Timed around everything, decoding and JSON encoding included; `neuronserve
        # bench` divides it by the request count. The metrics are written after the
        # response has left (DeferredMetrics says why).
        t0 = time.perf_counter()
        served = {}

        def report(model, run):
            served[model] = run.requests
            self.metrics.add(batch_values(run, model))

        requests = self._parse(data, context)
        results = self.worker.start(requests, report).result()
        out = self._answer(results, requests, context)
        self.metrics.add(handler_values((time.perf_counter() - t0) * 1e3, served))
        return out

    def _parse(self, data, context):
        from neuronserve.worker import RequestError, internal_error

        requests = []
        for idx, row in enumerate(data):
            field, body = _body(row)
            content_type = _content_type(context, idx, field, body)
            model = _header(context, idx, MODEL_HEADER)
            try:
                if body is None:
                    raise RequestError(
                        'empty request: send {"inputs": ...} as JSON, plain text '
                        'or a multipart field named "data"'
                    )
                runner = self.worker.runner(model)
                requests.append((runner, runner.parse(body, content_type)))
            except RequestError as e:
                requests.append((None, e))
            except Exception:  # noqa: BLE001 - a decoding bug fails this request, not the batch
                requests.append((None, internal_error("decoding the request")))
        return requests

    def _answer(self, results, requests, context):
        from neuronserve.worker import RequestError

        out = []
        for idx, result in enumerate(results):
            runner, request = requests[idx]
            content_type = "application/json"
            if not isinstance(result, RequestError):
                # orjson: json's encoder was a visible share of a lone request
                answer = runner.respond(request, result)
                body = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
                # an answer over TorchServe's max_response_size kills this worker (its
                # frame decoder refuses it): what the Runner could not foresee fails alone
                result = self._too_large(len(body)) or body
            if isinstance(result, RequestError):
                # the reason phrase is the status's own: the message is in the body only
                phrase = HTTPStatus(result.status).phrase
                context.set_response_status(code=result.status, phrase=phrase, idx=idx)
                result = orjson.dumps({"code": result.status, "error": result.message})
                content_type = "application/json"
            context.set_response_content_type(idx, content_type)
            out.append(result)
        return out

    def _too_large(self, size):
        limits = self.worker.limits
        return limits.check_answer(size, "as written") if limits is not None else None

    def _add(self, metric, value, labels) -> None:
        from neuronserve.worker import MODEL_LABEL, camel

        # A fresh dimension list each call: TorchServe appends default dimensions to it.
        # In the order metrics.yaml declares them: TorchServe pairs them by position.
        dims = [Dimension("ModelName", self.context.model_name), Dimension("Level", "Model")]
        dims.append(Dimension(MODEL_LABEL, labels.get(MODEL_LABEL, "")))
        dims += [Dimension(camel(k), str(labels[k])) for k in metric.labels]
        kind = MetricTypes.COUNTER if metric.kind == "counter" else MetricTypes.GAUGE
        self.context.metrics.add_metric(
            metric.camel_name, round(float(value), 4), metric.unit, None, dims, kind
        )


def _body(row):
    """(field name, body) of one TorchServe request row: a JSON/plain body (or a raw
    image) arrives as `body`, a multipart upload as its fields (`data`, or several: an
    image model takes each file field as an image, and a `parameters` field)."""
    for name in ("body", "data"):
        if name in row and row[name] is not None:
            return name, row[name]
    if len(row) == 1:
        return next(iter(row.items()))
    if row:
        return None, dict(row)
    return None, None


def _content_type(context, idx, name, body):
    if isinstance(body, str):
        return "text/plain"  # TorchServe decoded a text/* body for us
    if isinstance(body, (dict, list)):
        return "application/json"
    header = _header(context, idx, name) if name else None
    if isinstance(header, dict):
        return header.get("content-type")
    return None


def _header(context, idx, name):
    """Request `idx`'s header `name` (TorchServe keeps the case it was sent in), or None."""
    try:
        value = context.get_request_header(idx, name)
        if value is None:
            value = context.get_request_header(idx, name.lower())
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return value
