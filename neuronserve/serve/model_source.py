"""The models a folder holds, as the front and the container find them: a neuronserve
artifact, several side by side, or a store an engine's `neuronserve package` wrote (each
engine reads its own back). Each is reduced to its artifacts, so they can be packaged
again for this host's core groups. Where the container looks for that folder:
platforms/sagemaker/container.py.
"""

from __future__ import annotations

from pathlib import Path

from ..artifact import MANIFEST, read_manifest
from ..engines.base import engine_class
from ..processes import private_dir
from ..registry import ENGINES
from ..sources import FoundModel, ModelSourceError

__all__ = ["FoundModel", "ModelSourceError", "find_models"]


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
