"""What `neuronserve bench` and `soak` need of TorchServe: its own API is JSON over HTTP
(the same endpoint as the front's routes), its counters are the `ts_*` series, and the
handler's metrics are named in TorchServe's style."""

from __future__ import annotations

from ...load.endpoints import Endpoint, HttpJsonEndpoint
from ...load.protocols import NATIVE, SoakProtocol
from ...metrics import Metric
from ..base import NativeRoute
from ..bench import EngineBench


class TorchServeBench(EngineBench):
    counters = (
        "ts_inference_requests_total",
        "ts_queue_latency_microseconds",
        "ts_inference_latency_microseconds",
    )
    server_process = "java"
    worker_process = "model_service_worker"

    def endpoint(self, route: NativeRoute, label: str, headers: dict[str, str]) -> Endpoint:
        return HttpJsonEndpoint(label, route.protocol, route.url, {**route.headers, **headers})

    def external(self, protocol: str, where: str, label: str, headers: dict[str, str]) -> Endpoint:
        # a running TorchServe: http://HOST:PORT/predictions/MODEL
        return HttpJsonEndpoint(label, protocol, where, headers)

    def metric_name(self, metric: Metric) -> str:
        return metric.camel_name

    def soak(self, route: NativeRoute, model: str) -> tuple[str, SoakProtocol]:
        return route.url, NATIVE


BENCH = TorchServeBench()
