"""Where the SageMaker container (and `serve front`) finds its models and engine.

The models come from /opt/ml/model (SageMaker's model_data) when it holds any, else
from those baked into the image: a neuronserve artifact, several side by side, or a store
an engine's `neuronserve package` wrote (each engine reads its own back). Each is reduced
to its artifacts, so they can be packaged again for this host's core groups.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..artifact import MANIFEST, read_manifest
from ..engines.base import engine_class
from ..processes import private_dir
from ..registry import ENGINES, default_engine
from ..sources import FoundModel, ModelSourceError

__all__ = ["FoundModel", "ModelSourceError", "find_models"]

MODEL_DIR = "/opt/ml/model"
BAKED_DIR = "/opt/neuronserve/model"
CONFIG_FILE = "/opt/neuronserve/neuronserve.json"


def find_models(source: Path, work: Path) -> list[FoundModel]:
    """The neuronserve artifacts inside `source`, with the names and settings they were
    packaged with: an artifact, several artifacts side by side, or any engine's store
    built by `neuronserve package` (a .mar or its unpacked folder, a Triton repository),
    which its engine reads back."""
    if not source.is_dir():
        hub = " (a Hugging Face Hub id? serve it with --model)" if "/" in str(source) else ""
        raise ModelSourceError(f"{source} does not exist or is not a folder{hub}")
    if (source / MANIFEST).is_file():
        return [_artifact(source)]
    side_by_side = sorted(p.parent for p in source.glob(f"*/{MANIFEST}"))
    if side_by_side:
        return [_artifact(a) for a in side_by_side]
    # an engine's store is unpacked there: what the workers then run, so this user's alone
    private_dir(work)
    for name in ENGINES:
        found = engine_class(name).packaged_models(source, work / name)
        if found is not None:
            return found
    stores = " or ".join(f"a store built by `neuronserve package {e}`" for e in ENGINES)
    raise ModelSourceError(
        f"{source} holds no model: expected a neuronserve artifact (manifest.json), several "
        f"side by side, or {stores}"
    )


def store_engine(sources: list[Path]) -> str | None:
    """The engine whose `neuronserve package` wrote every store in `sources` (None when
    they are artifacts, or stores of different engines): what a front given them and no
    engine serves them on, as the user who packaged them for it expects."""
    found = {
        name
        for source in sources
        for name in ENGINES
        if Path(source).is_dir()
        and not (Path(source) / MANIFEST).is_file()
        and engine_class(name).models_in(Path(source))
    }
    return found.pop() if len(found) == 1 else None


def _artifact(folder: Path) -> FoundModel:
    return FoundModel(folder, read_manifest(folder, verify=False).name)


def model_source() -> Path:
    """SageMaker's model_data if mounted (NEURONSERVE_MODEL_DIR overrides the path), else
    the model baked into the image."""
    mounted = Path(os.environ.get("NEURONSERVE_MODEL_DIR", MODEL_DIR))
    if mounted.is_dir() and any(mounted.iterdir()):
        return mounted
    baked = Path(os.environ.get("NEURONSERVE_BAKED_MODEL", BAKED_DIR))
    if baked.is_dir() and any(baked.iterdir()):
        return baked
    raise ModelSourceError(
        f"no model in {mounted} (SageMaker model_data) nor baked into the image at {baked}"
    )


def engine_name() -> str:
    """The engine the build context was made for, else the first installed
    (`engines.default_engine`): the container's engine unless NEURONSERVE_ENGINE (the
    front's `engine` field) says another."""
    engine = None
    config = Path(os.environ.get("NEURONSERVE_CONFIG", CONFIG_FILE))
    if config.is_file():
        engine = json.loads(config.read_text()).get("engine")
    engine = engine or default_engine()
    if engine not in ENGINES:
        raise ModelSourceError(f"{config} names engine {engine!r}: use {' or '.join(ENGINES)}")
    return engine
