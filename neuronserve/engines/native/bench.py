"""What `neuronserve bench` and `soak` need of the native engine: it has no API of its
own (the front is its only door: bench it as `front-native`)."""

from __future__ import annotations

from ...load.endpoints import Endpoint
from ...load.protocols import SoakProtocol
from ..base import NativeRoute
from ..bench import EngineBench


class NativeBench(EngineBench):
    def endpoint(self, route: NativeRoute, label: str, headers: dict[str, str]) -> Endpoint:
        raise ValueError("the native engine has no API of its own: bench front-native")

    def soak(self, route: NativeRoute, model: str) -> tuple[str, SoakProtocol]:
        raise ValueError("the native engine has no API of its own: soak it behind the front")


BENCH = NativeBench()
