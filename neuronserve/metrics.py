"""The metrics both adapters export, defined once: TorchServe names them in its
CamelCase (`NeuronServeTokenizeMs`), Triton in Prometheus' snake_case
(`neuronserve_tokenize_ms`); the meaning and the values are the same.

Counters are running sums, so any window's per-request averages follow from two
scrapes; gauges describe the last batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # adapters import this before torch may be imported (pinning)
    from .execution import RunReport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # "counter" or "gauge"
    unit: str
    description: str
    labels: tuple[str, ...] = ()

    @property
    def camel_name(self) -> str:
        """Its name among metrics that are CamelCase (TorchServe's)."""
        return "NeuronServe" + camel(self.name)

    @property
    def snake_name(self) -> str:
        """Its name in Prometheus's own style (Triton's metrics, the workers' series on the
        front's /metrics, where a counter's series ends in _total)."""
        return "neuronserve_" + self.name


# the label every series of a model's work carries: which served model it concerns (a
# worker holds several); named the same by every server
MODEL_LABEL = "model"


def camel(name: str) -> str:
    """tokenize_ms -> TokenizeMs (the CamelCase metric and dimension style)."""
    return "".join(part.capitalize() for part in name.split("_"))


REQUESTS = Metric("requests", "counter", "count", "requests served")
TOKENIZE_MS = Metric("tokenize_ms", "counter", "ms", "time spent tokenizing (running sum)")
MODEL_MS = Metric("model_ms", "counter", "ms", "time spent in the model (running sum)")
HANDLER_MS = Metric(
    "handler_ms",
    "counter",
    "ms",
    "time in the adapter from batch in to responses out (running sum)",
)
BUCKET_RUNS = Metric(
    "bucket_runs",
    "counter",
    "count",
    "module calls, by bucket and rows in it",
    ("bucket", "batch_size"),
)
BATCH_REQUESTS = Metric("batch_requests", "gauge", "count", "requests in the last batch")
BATCH_TOKENIZE_MS = Metric("batch_tokenize_ms", "gauge", "ms", "tokenizing the last batch")
BATCH_MODEL_MS = Metric("batch_model_ms", "gauge", "ms", "model time of the last batch")
PADDING_RATIO = Metric(
    "padding_ratio", "gauge", "ratio", "padded tokens per real token in the last batch"
)

METRICS = (
    REQUESTS,
    TOKENIZE_MS,
    MODEL_MS,
    HANDLER_MS,
    BUCKET_RUNS,
    BATCH_REQUESTS,
    BATCH_TOKENIZE_MS,
    BATCH_MODEL_MS,
    PADDING_RATIO,
)
# each metric by its name (how a worker's report names it on the workers' wire)
BY_NAME = {m.name: m for m in METRICS}


def batch_values(report: RunReport, model: str) -> Iterator[tuple[Metric, float, dict[str, str]]]:
    """(metric, value, labels) for one batch a model's Runner served; counters get the
    batch's increment. HANDLER_MS is the adapter's to add: only it sees the whole call."""
    own = {MODEL_LABEL: model}
    yield REQUESTS, report.requests, own
    yield TOKENIZE_MS, report.tokenize_ms, own
    yield MODEL_MS, report.model_ms, own
    yield BATCH_REQUESTS, report.requests, own
    yield BATCH_TOKENIZE_MS, report.tokenize_ms, own
    if report.runs:
        yield BATCH_MODEL_MS, report.model_ms, own
        yield PADDING_RATIO, report.padding_ratio, own
    for run in report.runs:
        yield BUCKET_RUNS, 1, {**own, "bucket": run.bucket.key, "batch_size": str(run.rows)}


def handler_values(
    handler_ms: float, requests: dict[str, int]
) -> Iterator[tuple[Metric, float, dict[str, str]]]:
    """HANDLER_MS of one batch, shared among its models by their requests."""
    total = sum(requests.values()) or 1
    for model, n in requests.items():
        yield HANDLER_MS, handler_ms * n / total, {MODEL_LABEL: model}


Emit = Callable[[Metric, float, dict[str, str]], None]


class DeferredMetrics:
    """Batch values held in the worker and handed to `emit` by a thread of their own,
    at most every `interval_s`, counters summed and gauges at their last value.

    TorchServe's handler metrics are log lines its frontend parses: nine per batch,
    written before the response leaves, are a visible share of a lone request's round
    trip (the development guide's observations). Here the response goes
    first, and under load one flush carries many batches. A scrape may lag by up to
    `interval_s`; every count is in one flush with its sums, so per-request averages
    stay consistent.
    """

    INTERVAL_S = 0.25

    def __init__(self, emit: Emit, interval_s: float = INTERVAL_S):
        self._emit, self.interval_s = emit, interval_s
        self._lock = threading.Lock()
        self._pending: dict[tuple[Metric, tuple[tuple[str, str], ...]], float] = {}
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="neuronserve-metrics", daemon=True)
        self._thread.start()

    def add(self, values: Iterable[tuple[Metric, float, dict[str, str]]]) -> None:
        with self._lock:
            for metric, value, labels in values:
                # in the metric's own label order: TorchServe pairs dimension values
                # with the names it registered by position
                order = {name: i for i, name in enumerate((MODEL_LABEL, *metric.labels))}
                key = (metric, tuple(sorted(labels.items(), key=lambda kv: order.get(kv[0], 99))))
                before = self._pending.get(key, 0.0) if metric.kind == "counter" else 0.0
                self._pending[key] = before + float(value)
        self._wake.set()

    def close(self) -> None:
        """Emit what is pending now and stop the thread: an adapter's finalize, so that
        nothing is emitted after its server has let the model go."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            if not self._closed:
                time.sleep(self.interval_s)  # the response leaves first; later batches join
            with self._lock:
                pending, self._pending = self._pending, {}
                self._wake.clear()
            for (metric, labels), value in pending.items():
                try:
                    self._emit(metric, value, dict(labels))
                except Exception:  # a metric must never stop the worker
                    log.exception("could not emit %s", metric.name)
            if self._closed:
                return
