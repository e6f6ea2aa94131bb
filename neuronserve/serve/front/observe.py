"""The front's own Prometheus metrics (prometheus_client, a registry of its own): requests
by route and status, latency by route, requests in flight. /metrics serves them followed
by the engine's own metrics."""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

# the *_created series (a timestamp per label set) only double what is exposed
disable_created_metrics()

# seconds: from a fast embedding at low load to the default deadline
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class FrontMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "neuronserve_front_requests",
            "Requests the front answered, by route and HTTP status",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "neuronserve_front_request_duration_seconds",
            "Time from a request's arrival at the front to its answer, by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "neuronserve_front_in_flight",
            "Requests the front is working on (counted against max_in_flight)",
            registry=self.registry,
        )

        # label lookups cost more than the update: each series is looked up once
        self._series: dict[tuple[str, int], tuple[Any, Any]] = {}

    def observe(self, route: str, status: int, seconds: float) -> None:
        series = self._series.get((route, status))
        if series is None:
            series = (self.requests.labels(route, str(status)), self.latency.labels(route))
            self._series[(route, status)] = series
        series[0].inc()
        series[1].observe(seconds)
