"""TorchServe handler shipped inside every neuronserve .mar: a thin adapter over Runner.

initialize: lease a core group and pin to it, then load the artifact and warm it up.
preprocess: TorchServe request rows -> parsed requests (bad ones become errors in place).
inference:  one Runner call for the whole batch TorchServe formed.
postprocess: per-request JSON and HTTP status; metrics for bucket, padding and timings.

The server-independent work (decoding, tokenizing, bucketing, padding, running,
unpadding, task output) lives in `neuronserve.runtime.Runner`, shared with Triton.
"""

from __future__ import annotations

import json
import logging
import os
import time

from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)

# Written into the model archive by `neuronserve package torchserve`.
CONFIG_SECTION = "neuronserve"


class NeuronServeHandler(BaseHandler):
    def initialize(self, context):
        try:
            self._initialize(context)
        except Exception as e:
            # One line with this marker is what `neuronserve serve` reports instead of
            # waiting for a worker that will never be READY.
            logger.error("neuronserve: worker failed to start: %s", " | ".join(str(e).splitlines()))
            raise

    def _initialize(self, context):
        # BaseHandler.initialize is skipped on purpose: it picks a device (and on Neuron
        # hosts the XLA device) and loads model.pt itself; the Runner keeps inputs on the
        # host and loads the artifact the manifest describes.
        from neuronserve import cores

        self.context = context
        self.manifest = context.manifest
        props = context.system_properties
        cfg = (getattr(context, "model_yaml_config", None) or {}).get(CONFIG_SECTION, {})
        kind = cfg.get("core_kind", "cpu")
        owner = f"torchserve:{context.model_name}"
        self.lease = cores.claim(kind, int(cfg.get("cores_per_worker", 1)), owner=owner,
                                 neuron_cores=cfg.get("neuron_cores"))
        # Before anything imports the Neuron SDK: its runtime reads the pinning variables
        # once. Inputs stay on the host; the compiled graph moves them to the device.
        cores.pin(self.lease, target=cfg.get("target"))
        logger.info("neuronserve: pid %d leased %s core group %d (cores %s)", os.getpid(), kind,
                    self.lease.group.index, self.lease.group.label)

        from neuronserve.runtime import Runner

        artifact = os.path.join(props["model_dir"], cfg.get("artifact", "artifact"))
        self.runner = Runner(artifact, truncation=cfg.get("truncation"))
        self.initialized = True
        logger.info("neuronserve: worker ready, buckets %s warmed up",
                    [b.key for b in self.runner.grid.buckets])

    def preprocess(self, data):
        from neuronserve.tasks import RequestError

        requests = []
        for idx, row in enumerate(data):
            name, body = _body(row)
            content_type = _content_type(self.context, idx, name, body)
            try:
                if body is None:
                    raise RequestError('empty request: send {"inputs": ...} as JSON, plain text '
                                       'or a multipart field named "data"')
                requests.append(self.runner.parse(body, content_type))
            except RequestError as e:
                requests.append(e)
        return requests

    def handle(self, data, context):
        # Timed here, around BaseHandler's own, so the sum covers decoding and JSON encoding
        # as well as the Runner; `neuronserve bench` divides it by the request count.
        t0 = time.perf_counter()
        out = super().handle(data, context)
        self.context.metrics.add_metric(
            "NeuronServeHandlerMs", round((time.perf_counter() - t0) * 1e3, 3), "ms", None,
            self._dims(), MetricTypes.COUNTER)
        return out

    def _dims(self, **extra):
        # A fresh list each call: TorchServe appends default dimensions to it.
        return [Dimension("ModelName", self.context.model_name), Dimension("Level", "Model")] + [
            Dimension(k, str(v)) for k, v in extra.items()]

    def inference(self, data, *args, **kwargs):
        from neuronserve.runtime import RunReport

        self.report = RunReport()
        return self.runner.run(data, self.report)

    def postprocess(self, data):
        from neuronserve.tasks import RequestError

        out = []
        for idx, result in enumerate(data):
            self.context.set_response_content_type(idx, "application/json")
            if isinstance(result, RequestError):
                self.context.set_response_status(code=result.status, phrase=result.message,
                                                 idx=idx)
                out.append(json.dumps({"code": result.status, "error": result.message}))
            else:
                out.append(json.dumps(result))
        self._emit_metrics()
        return out

    def _emit_metrics(self) -> None:
        report, metrics, dims = self.report, self.context.metrics, self._dims
        for name, value in (("NeuronServeRequests", report.requests),
                            ("NeuronServeTokenizeMs", round(report.tokenize_ms, 3)),
                            ("NeuronServeModelMs", round(report.model_ms, 3))):
            metrics.add_metric(name, value, "ms" if name.endswith("Ms") else "count", None,
                               dims(), MetricTypes.COUNTER)
        metrics.add_metric("NeuronServeBatchRequests", report.requests, "count", None, dims(),
                           MetricTypes.GAUGE)
        metrics.add_metric("NeuronServeTokenizeTime", round(report.tokenize_ms, 3), "ms", None,
                           dims(), MetricTypes.GAUGE)
        if report.runs:
            metrics.add_metric("NeuronServeModelTime", round(report.model_ms, 3), "ms", None,
                               dims(), MetricTypes.GAUGE)
            metrics.add_metric("NeuronServePaddingRatio", round(report.padding_ratio, 4),
                               "ratio", None, dims(), MetricTypes.GAUGE)
        for run in report.runs:
            metrics.add_metric("NeuronServeBucketRuns", 1, "count", None,
                               dims(Bucket=run.bucket.key, BatchSize=run.rows),
                               MetricTypes.COUNTER)


def _body(row):
    """(field name, body) of one TorchServe request row: a JSON/plain body arrives as
    `body`, a multipart upload as the field `data`."""
    for name in ("body", "data"):
        if name in row and row[name] is not None:
            return name, row[name]
    if len(row) == 1:
        return next(iter(row.items()))
    return None, None


def _content_type(context, idx, name, body):
    if isinstance(body, str):
        return "text/plain"  # TorchServe decoded a text/* body for us
    if isinstance(body, (dict, list)):
        return "application/json"
    try:
        header = context.get_request_header(idx, name) if name else None
    except (KeyError, IndexError, TypeError):
        header = None
    if isinstance(header, dict):
        return header.get("content-type")
    return None
