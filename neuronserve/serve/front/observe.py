"""The front's own Prometheus metrics (prometheus_client, a registry of its own): requests
by route, status and model, latency by route and model, requests in flight, and how busy
the host and the chip are (the deployment's CPU seconds by role; on a Neuron host each
NeuronCore's utilization from neuron-monitor). /metrics serves them followed by the
workers' own metrics. `model` is empty for a request that reached no model (a probe, or
one refused before its model was known)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import psutil
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ... import traffic
from ...host_load import NeuronMonitor, cpu_seconds
from ...metrics import MODEL_LABEL

# the *_created series (a timestamp per label set) only double what is exposed
disable_created_metrics()

# seconds: from a fast embedding at low load to the default deadline
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


# a sample's `model` label (the one label every per-model series carry, ours as
# metrics.MODEL_LABEL, Triton's own), its value unescaped enough to compare a model name
_MODEL_LABEL = re.compile(rf'[{{,]\s*{MODEL_LABEL}="((?:[^"\\]|\\.)*)"')


class FrontMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "neuronserve_front_requests",
            "Requests the front answered, by route, HTTP status and model",
            ["route", "status", "model"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "neuronserve_front_request_duration_seconds",
            "Time from a request's arrival at the front to its answer, by route and model",
            ["route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "neuronserve_front_in_flight",
            "Requests the front is working on (counted against max_in_flight)",
            registry=self.registry,
        )
        # requests that arrive together go to the workers as one call (coalescing.py)
        self.worker_calls, self.worker_requests = (
            Counter(name, doc, ["model"], registry=self.registry)
            for name, doc in (
                ("neuronserve_front_worker_calls", "Calls the front made to the workers"),
                ("neuronserve_front_worker_requests", "Requests those calls carried"),
            )
        )

        # what `neuronserve tune` reads back (traffic.py): each text's tokens, by model
        self.text_tokens = Histogram(
            traffic.TEXT_TOKENS,
            "Tokens of each text requests sent, as the model read them before padding (all "
            "its chunks' for a text sent in chunks), by model",
            ["model"],
            buckets=traffic.TOKEN_BUCKETS,
            registry=self.registry,
        )
        self._add_model_metrics()
        self._add_tei_metrics()
        # set on a Neuron host once the workers are up (watch_neuron_cores)
        self.monitor: NeuronMonitor | None = None
        self.registry.register(HostLoad(self))

        # what the workers held models as (worker keys) that are unloaded for good: the
        # workers' own series of them are not passed on
        self.gone: set[str] = set()
        # label lookups cost more than the update: each series is looked up once
        self._series: dict[tuple[str, int, str], tuple[Any, Any]] = {}
        self._call_series: dict[str, tuple[Any, Any]] = {}

    def _add_model_metrics(self) -> None:
        # multi-model: cold starts, by model (multi_model.py)
        self.model_loads = Counter(
            "neuronserve_model_loads",
            "Times a model was loaded onto every worker",
            ["model"],
            registry=self.registry,
        )
        self.model_evictions = Counter(
            "neuronserve_model_evictions",
            "Times a model was unloaded to make room, or after idling",
            ["model"],
            registry=self.registry,
        )
        self.model_load_seconds = Counter(
            "neuronserve_model_load_seconds",
            "Seconds spent loading a model onto every worker",
            ["model"],
            registry=self.registry,
        )
        self.model_waited = Counter(
            "neuronserve_model_waited_requests",
            "Requests that waited for their model to load",
            ["model"],
            registry=self.registry,
        )
        self.models_loaded = Gauge(
            "neuronserve_models_loaded",
            "Models every worker holds now",
            registry=self.registry,
        )

    def _add_tei_metrics(self) -> None:
        """text-embeddings-inference's own series, under its names, so that dashboards
        and alerts written for TEI work unchanged (its router's metrics: request count,
        success, failure by error type, duration, inference duration, queue size). TEI's
        tokenization and queue durations and its batch series have no counterpart here:
        the workers batch, and their own series (/metrics, after ours) say how."""
        r = self.registry
        self.te_count = Counter("te_request_count", "Inference requests received", registry=r)
        self.te_success = Counter("te_request_success", "Inference requests answered", registry=r)
        self.te_failure = Counter(
            "te_request_failure", "Inference requests refused or failed, by TEI's error type",
            ["err"], registry=r,
        )  # fmt: skip
        self.te_duration = Histogram(
            "te_request_duration", "Seconds from arrival to answer of an inference request",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.te_inference = Histogram(
            "te_request_inference_duration", "Seconds a request waited on the workers",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.te_queue = Gauge("te_queue_size", "Inference requests in flight", registry=r)

    def watch_neuron_cores(self) -> bool:
        """Export each NeuronCore's utilization from neuron-monitor, where it is
        installed (False where it is not)."""
        monitor = NeuronMonitor(owned=_deployment_pids)
        if not monitor.start():
            return False
        self.monitor = monitor
        return True

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None

    def inference(self, status: int, seconds: float) -> None:
        """One inference request answered, in TEI's series."""
        self.te_count.inc()
        if status < 400:
            self.te_success.inc()
            self.te_duration.observe(seconds)
        else:
            self.te_failure.labels(tei_error(status)).inc()

    def observe(self, route: str, status: int, seconds: float, model: str = "") -> None:
        key = (route, status, model)
        series = self._series.get(key)
        if series is None:
            series = (
                self.requests.labels(route, str(status), model),
                self.latency.labels(route, model),
            )
            self._series[key] = series
        series[0].inc()
        series[1].observe(seconds)

    def texts(self, model: str, tokens: list[int] | None) -> None:
        """The tokens of each text of a request the workers answered."""
        if tokens:
            series = self.text_tokens.labels(model)
            for n in tokens:
                series.observe(n)

    def worker_call(self, model: str, requests: int) -> None:
        series = self._call_series.get(model)
        if series is None:
            series = (self.worker_calls.labels(model), self.worker_requests.labels(model))
            self._call_series[model] = series
        series[0].inc()
        series[1].inc(requests)

    def serving(self, key: str) -> None:
        """The workers hold a model as `key` (again): the workers' series of it are
        passed on."""
        self.gone.discard(key)

    def dropped(self, key: str) -> None:
        """The workers no longer hold a model as `key`, for good (a DELETE, the old
        version of a swap)."""
        self.gone.add(key)

    def workers_text(self, text: str) -> str:
        """The workers' own Prometheus text without the series of models no longer
        served (the workers keep counting a model it was told to drop)."""
        if not self.gone:
            return text
        kept = []
        for line in text.splitlines(keepends=True):
            found = _MODEL_LABEL.search(line) if not line.startswith("#") else None
            if found is None or found.group(1) not in self.gone:
                kept.append(line)
        return "".join(kept)

    def forget_model(self, model: str) -> None:
        """Drop every series of `model` (unloaded for good): registrations of new names
        must not grow /metrics without bound."""
        for metric in (
            self.model_loads,
            self.model_evictions,
            self.model_load_seconds,
            self.model_waited,
            self.worker_calls,
            self.worker_requests,
            self.text_tokens,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(model)
        self._call_series.pop(model, None)
        for key in [k for k in self._series if k[2] == model]:
            route, status, _ = key
            del self._series[key]
            with contextlib.suppress(KeyError):
                self.requests.remove(route, str(status), model)
            with contextlib.suppress(KeyError):
                self.latency.remove(route, model)


def _deployment_pids() -> set[int]:
    """This front's processes: itself and what it started (its workers)."""
    me = psutil.Process()
    try:
        return {me.pid, *(p.pid for p in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


class HostLoad(Collector):
    """Read at each scrape: the CPU seconds of the front and of the workers' processes
    (its server and workers: the front's children), and the NeuronCores' utilization.
    CPU per request is rate(neuronserve_host_cpu_seconds_total) over
    rate(neuronserve_front_requests_total); next to the NeuronCores' utilization it says
    whether the host or the chip sets the pace (`neuronserve doctor --url`)."""

    def __init__(self, metrics: FrontMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        front, workers = cpu_seconds()
        cpu = CounterMetricFamily(
            "neuronserve_host_cpu_seconds",
            "CPU seconds (user + system) of this deployment's processes, by role: the "
            "front, and the workers",
            labels=["role"],
        )
        cpu.add_metric(["front"], front)
        cpu.add_metric(["workers"], workers)
        yield cpu
        monitor = self.metrics.monitor
        if monitor is None:
            return
        now = GaugeMetricFamily(
            "neuronserve_neuroncore_utilization_percent",
            "Each NeuronCore's utilization over neuron-monitor's last period",
            labels=["neuroncore"],
        )
        busy = CounterMetricFamily(
            "neuronserve_neuroncore_busy_seconds",
            "Seconds each NeuronCore was busy since the front started (utilization x time)",
            labels=["neuroncore"],
        )
        found = monitor.utilization()
        for core, percent in sorted(found.items()):
            now.add_metric([str(core)], percent)
        yield GaugeMetricFamily(
            "neuronserve_neuroncores_in_use",
            "NeuronCores neuron-monitor reported in use in its last period",
            value=len(found),
        )
        for core, seconds in sorted(monitor.busy_seconds().items()):
            busy.add_metric([str(core)], seconds)
        yield now
        yield busy


def tei_error(status: int) -> str:
    """TEI's error type (its ErrorType, as its `err` label spells it) for a status."""
    if status in (429, 503):
        return "overloaded"
    if status in (400, 413, 422, 404):
        return "validation"
    return "backend"
