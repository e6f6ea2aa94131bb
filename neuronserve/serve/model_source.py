"""The models a folder holds, as the front and the container find them: a neuronserve
artifact, several side by side, or what `neuronserve package` wrote for Triton or
TorchServe (each packager reads its own back). Each is reduced to its artifacts, so they
can be packaged again for this host's core groups. Where the container looks for that folder:
platforms/sagemaker/container.py.
"""

from __future__ import annotations

from pathlib import Path

from ..artifact import MANIFEST, read_manifest
from ..packaging import torchserve, triton
from ..processes import private_dir
from ..sources import FoundModel, ModelSourceError
from ..workers import package as workers_store

__all__ = ["FoundModel", "ModelSourceError", "find_models"]


def find_models(source: Path, work: Path) -> list[FoundModel]:
    """The neuronserve artifacts inside `source`, with the names and settings they were
    packaged with: an artifact, several artifacts side by side, or a store built by
    `neuronserve package` (a .mar or its unpacked folder, a Triton repository, the
    workers' own)."""
    if not source.is_dir():
        hub = " (a Hugging Face Hub id? serve it with --model)" if "/" in str(source) else ""
        raise ModelSourceError(f"{source} does not exist or is not a folder{hub}")
    if (source / MANIFEST).is_file():
        return [_artifact(source)]
    side_by_side = sorted(p.parent for p in source.glob(f"*/{MANIFEST}"))
    if side_by_side:
        return [_artifact(a) for a in side_by_side]
    # a .mar is unpacked there: what the workers then run, so this user's alone
    private_dir(work)
    found = (
        triton.packaged_models(source)
        or torchserve.packaged_models(source, work / "torchserve")
        or workers_store.packaged_models(source)
    )
    if found is not None:
        return found
    raise ModelSourceError(
        f"{source} holds no model: expected a neuronserve artifact (manifest.json), several "
        "side by side, or a store built by `neuronserve package triton` or `neuronserve "
        "package torchserve`"
    )


def _artifact(folder: Path) -> FoundModel:
    return FoundModel(folder, read_manifest(folder, verify=False).name)
