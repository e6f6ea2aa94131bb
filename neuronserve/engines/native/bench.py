"""What `neuronserve bench` and `soak` need of the native engine: it has no API of its
own (the front is its only door: bench it as `front-native`); its series are the
front's copy of what each batch reported (neuronserve.metrics, Prometheus' names)."""

from __future__ import annotations

from ...load.endpoints import Endpoint
from ...load.protocols import SoakProtocol
from ...metrics import Metric
from ..base import NativeRoute
from ..bench import EngineBench


class NativeBench(EngineBench):
    # no queue or server-time counters of its own: its queue is the worker's, and the
    # time a request spends there is the front's engine-call time on /metrics
    counters = ("", "", "")
    server_process = "neuronserve.engines.native.supervisor"
    worker_process = "neuronserve.engines.native.worker"

    def endpoint(self, route: NativeRoute, label: str, headers: dict[str, str]) -> Endpoint:
        raise ValueError("the native engine has no API of its own: bench front-native")

    def metric_name(self, metric: Metric) -> str:
        return metric.snake_name + ("_total" if metric.kind == "counter" else "")

    def soak(self, route: NativeRoute, model: str) -> tuple[str, SoakProtocol]:
        raise ValueError("the native engine has no API of its own: soak it behind the front")


BENCH = NativeBench()
