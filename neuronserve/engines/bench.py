"""What bench and soak need of each engine, behind one interface (EngineBench) every
engine's package implements in its bench.py: an endpoint for each protocol of its own
API, and where soak sends its requests there (what its processes and metrics are called
is in its EngineFacts)."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from ..registry import ENGINES
from .base import engine_class

if TYPE_CHECKING:
    from ..load.endpoints import Endpoint
    from ..load.protocols import SoakProtocol
    from .base import NativeRoute


class EngineBench(ABC):
    """What bench and soak need of an engine (its package's bench.py): an endpoint for
    each protocol of its own API, and where soak sends its requests there."""

    @abstractmethod
    def endpoint(self, route: NativeRoute, label: str, headers: dict[str, str]) -> Endpoint:
        """The endpoint for the engine's own API at `route` (`headers` besides its own):
        one its start gave, or an already running server's, named on the command line as
        `protocol:URL/MODEL`."""

    @abstractmethod
    def soak(self, route: NativeRoute, model: str) -> tuple[str, SoakProtocol]:
        """(URL, protocol) soak sends `model`'s requests to on the engine's own API at
        `route`."""


def engine_bench(name: str) -> EngineBench:
    """Engine `name`'s bench support (engines/<name>/bench.py)."""
    if name not in ENGINES:
        raise ValueError(f"engine {name!r}: choose {' or '.join(ENGINES)}")
    found: EngineBench = importlib.import_module(f"neuronserve.engines.{name}.bench").BENCH
    return found


def protocol_bench(protocol: str) -> EngineBench:
    """The bench support of the engine whose own API speaks `protocol`."""
    for name in ENGINES:
        if protocol in engine_class(name).facts.protocols:
            return engine_bench(name)
    raise ValueError(f"no engine speaks {protocol!r}")
