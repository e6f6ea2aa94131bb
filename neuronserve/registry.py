"""The engine registry: the one place that knows which engines exist and where each is
implemented (one package each, under engines/). Adding an engine is adding its package
and one line here; its Engine class is `engines.base.engine_class(name)`. It sits at the
bottom of the house, below the spec that holds each engine's section: engines are
looked up by name when one is asked for (importlib), so a TorchServe image never imports
tritonclient and the other way round; a section module imports pydantic only, so reading
a spec imports no engine."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .section import EngineSection

ENGINES_PACKAGE = "neuronserve.engines"
# engine name -> its package under neuronserve.engines, which holds `engine.py` (the
# Engine class, named in the value) and `section.py` (its spec section, `<Class>Section`).
# In order of preference: Triton is maintained and keeps several batches in flight per
# worker; TorchServe is archived upstream (2025-08): fully supported, never required;
# the native engine (neuronserve's own workers on unix sockets, no server between the
# front and the cores) has no API but the front's.
_PACKAGES = {
    "triton": "Triton",
    "torchserve": "TorchServe",
    "native": "Native",
}
ENGINES = tuple(_PACKAGES)
# what an image (SageMaker, Kubernetes) runs unless told: it is built elsewhere, so what
# this machine has installed does not say
IMAGE_ENGINE = ENGINES[0]


def default_engine() -> str:
    """The engine a spec that names none runs on: the first of ENGINES that can start on
    this machine (`EngineSection.missing`); where none can, the first, whose start then
    says what to install."""
    for name in ENGINES:
        if section_class(name).missing() is None:
            return name
    return ENGINES[0]


class UnknownEngine(ValueError):
    pass


def class_name(name: str) -> str:
    try:
        return _PACKAGES[name]
    except KeyError:
        raise UnknownEngine(f"engine {name!r}: choose {' or '.join(ENGINES)}") from None


def section_class(name: str) -> type[EngineSection]:
    cls = f"{class_name(name)}Section"
    found: type[EngineSection] = getattr(
        importlib.import_module(f"{ENGINES_PACKAGE}.{name}.section"), cls
    )
    return found
