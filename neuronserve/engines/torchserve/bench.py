"""What `neuronserve bench` and `soak` need of TorchServe: its own API is JSON over HTTP
(the same endpoint as the front's routes)."""

from __future__ import annotations

from ...load.endpoints import Endpoint, HttpJsonEndpoint
from ...load.protocols import NATIVE, SoakProtocol
from ..base import NativeRoute
from ..bench import EngineBench


class TorchServeBench(EngineBench):
    def endpoint(self, route: NativeRoute, label: str, headers: dict[str, str]) -> Endpoint:
        return HttpJsonEndpoint(label, route.protocol, route.url, {**route.headers, **headers})

    def external(self, protocol: str, where: str, label: str, headers: dict[str, str]) -> Endpoint:
        # a running TorchServe: http://HOST:PORT/predictions/MODEL
        return HttpJsonEndpoint(label, protocol, where, headers)

    def soak(self, route: NativeRoute, model: str) -> tuple[str, SoakProtocol]:
        return route.url, NATIVE


BENCH = TorchServeBench()
