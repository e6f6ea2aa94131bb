"""The metrics both adapters export, defined once: TorchServe names them in its
CamelCase (`NeuronServeTokenizeMs`), Triton in Prometheus' snake_case
(`neuronserve_tokenize_ms`); the meaning and the values are the same.

Counters are running sums, so any window's per-request averages follow from two
scrapes; gauges describe the last batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # adapters import this before torch may be imported (pinning)
    from .execution import RunReport


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # "counter" or "gauge"
    unit: str
    description: str
    labels: tuple[str, ...] = ()

    @property
    def torchserve_name(self) -> str:
        return "NeuronServe" + camel(self.name)

    @property
    def triton_name(self) -> str:
        return "neuronserve_" + self.name


def camel(name: str) -> str:
    """tokenize_ms -> TokenizeMs (TorchServe's metric and dimension style)."""
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


def batch_values(report: RunReport) -> Iterator[tuple[Metric, float, dict[str, str]]]:
    """(metric, value, labels) for one batch the Runner served; counters get the
    batch's increment. HANDLER_MS is the adapter's to add: only it sees the whole call."""
    yield REQUESTS, report.requests, {}
    yield TOKENIZE_MS, report.tokenize_ms, {}
    yield MODEL_MS, report.model_ms, {}
    yield BATCH_REQUESTS, report.requests, {}
    yield BATCH_TOKENIZE_MS, report.tokenize_ms, {}
    if report.runs:
        yield BATCH_MODEL_MS, report.model_ms, {}
        yield PADDING_RATIO, report.padding_ratio, {}
    for run in report.runs:
        yield BUCKET_RUNS, 1, {"bucket": run.bucket.key, "batch_size": str(run.rows)}
