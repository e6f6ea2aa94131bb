"""The engine registry: the one place that knows which engines exist and where each is
implemented (one package each, under engines/). Adding an engine is adding its package
and one line here; its Engine class is `engines.base.engine_class(name)`. Modules are
imported when an engine is asked for, so a TorchServe image never imports tritonclient
and the other way round; a section module imports pydantic only, so reading a spec
imports no engine."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..section import EngineSection

# engine name -> its package under neuronserve.engines, which holds `engine.py` (the
# Engine class, named in the value) and `section.py` (its spec section, `<Class>Section`)
_PACKAGES = {
    "torchserve": "TorchServe",
    "triton": "Triton",
}
ENGINES = tuple(_PACKAGES)
DEFAULT_ENGINE = ENGINES[0]


class UnknownEngine(ValueError):
    pass


def class_name(name: str) -> str:
    try:
        return _PACKAGES[name]
    except KeyError:
        raise UnknownEngine(f"engine {name!r}: choose {' or '.join(ENGINES)}") from None


def section_class(name: str) -> type[EngineSection]:
    cls = f"{class_name(name)}Section"
    found: type[EngineSection] = getattr(importlib.import_module(f"{__name__}.{name}.section"), cls)
    return found
