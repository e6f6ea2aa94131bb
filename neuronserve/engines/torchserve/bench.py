"""What `neuronserve bench` and `soak` need of TorchServe: its own API is JSON over HTTP
(the same endpoint as the front's routes)."""

from __future__ import annotations

from ...load.endpoints import Endpoint, HttpJsonEndpoint
from ...load.protocols import NATIVE, SoakProtocol
from ..base import NativeRoute
from ..bench import EngineBench


class TorchServeBench(EngineBench):
    def endpoint(self, route: NativeRoute, label: str, headers: dict[str, str]) -> Endpoint:
        url = f"{route.url}/{route.model}"
        return HttpJsonEndpoint(label, route.protocol, url, {**route.headers, **headers})

    def soak(self, route: NativeRoute, model: str) -> tuple[str, SoakProtocol]:
        return f"{route.url}/{model}", NATIVE


BENCH = TorchServeBench()
