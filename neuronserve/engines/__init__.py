"""The engine registry: the one place that knows which engines exist and where each is
implemented. Modules are imported when an engine is asked for, so a TorchServe image
never imports tritonclient and the other way round."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Engine

# engine name -> "module:class" implementing engines.base.Engine
_IMPLEMENTATIONS = {
    "torchserve": "neuronserve.engines.torchserve.process:TorchServe",
    "triton": "neuronserve.engines.triton.process:Triton",
}
ENGINES = tuple(_IMPLEMENTATIONS)


class UnknownEngine(ValueError):
    pass


def engine_class(name: str) -> type[Engine]:
    try:
        module, cls = _IMPLEMENTATIONS[name].split(":")
    except KeyError:
        raise UnknownEngine(f"engine {name!r}: choose {' or '.join(ENGINES)}") from None
    found: type[Engine] = getattr(importlib.import_module(module), cls)
    return found


def engine(name: str, run_dir: Path) -> Engine:
    """Engine `name` run from `run_dir` (started or not)."""
    return engine_class(name)(run_dir)
