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
from ..engines import ENGINES, default_engine
from ..engines.base import FoundModel, ModelSourceError, engine_class

__all__ = ["FoundModel", "ModelSourceError", "UnpackLimits", "find_models", "unpack_tar"]

MODEL_DIR = "/opt/ml/model"
BAKED_DIR = "/opt/neuronserve/model"
CONFIG_FILE = "/opt/neuronserve/neuronserve.json"


# the most files an archive may hold: an artifact has a few, and one file per bucket on
# Neuron; a tar of hundreds of thousands of empty members costs time, not bytes
MAX_MEMBERS = 10_000
# what an archive may unpack to beyond its own size (times): weights barely compress, so a
# real model's archive is near its unpacked size; a 4 MB archive of zeros is not
MAX_RATIO = 20
# the least it may always unpack to (small artifacts compress well: a tokenizer, a config)
MIN_ROOM = 256 * 2**20
# what unpacking leaves free on the disk it writes to
DISK_MARGIN = 1 << 30


class UnpackLimits:
    """How much an archive of `size` bytes may unpack to in `work`: at most MAX_MEMBERS
    members and the least of MAX_RATIO times its size (at least MIN_ROOM), what the disk
    has free less DISK_MARGIN, and `most` (a caller's own bound, such as a worker's
    memory budget)."""

    def __init__(self, size: int, work: Path, most: int | None = None):
        import shutil

        Path(work).mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(work).free - DISK_MARGIN
        self.bytes = min(max(MAX_RATIO * size, MIN_ROOM), free, most if most else free)
        self.members = MAX_MEMBERS
        self.why = (
            "the disk's free space (less 1 GiB)"
            if self.bytes == free
            else ("the memory budget of a worker" if self.bytes == most else
                  f"{MAX_RATIO} times the archive's size (at least {MIN_ROOM >> 20} MiB)")
        )  # fmt: skip

    def check(self, what: str, members: int, total: int) -> None:
        if members > self.members:
            raise ModelSourceError(
                f"{what} holds more than {self.members} files: not a neuronserve artifact "
                "(not extracted)"
            )
        if total > self.bytes:
            raise ModelSourceError(
                f"{what} unpacks to more than {self.bytes / 2**20:.0f} MiB, {self.why}: "
                "not extracted"
            )


def unpack_tar(tarballs: list[Path], dest: Path, most: int | None = None) -> None:
    """Extract `tarballs` (gzip or not) into `dest` within one UnpackLimits for them all
    (their sizes together: many small archives get no more room than one of their joint
    size), member by member: each header is checked before its member is written
    (tarfile writes exactly the size a header declares), so a bomb stops at its limit,
    and whatever was written is removed. Links, devices and paths out of `dest` are
    refused (tarfile's "data" filter)."""
    import shutil
    import tarfile

    limits = UnpackLimits(sum(t.stat().st_size for t in tarballs), dest.parent, most)
    members = total = 0
    for tarball in tarballs:
        try:
            with tarfile.open(tarball) as t:
                for member in t:
                    members += 1
                    total += member.size
                    what = (
                        tarball.name
                        if len(tarballs) == 1
                        else f"{tarball.name} (with those before it)"
                    )
                    limits.check(what, members, total)
                    t.extract(member, dest, filter="data")
        except (tarfile.TarError, OSError, ModelSourceError) as e:
            shutil.rmtree(dest, ignore_errors=True)
            if isinstance(e, ModelSourceError):
                raise
            if isinstance(e, tarfile.FilterError):
                why = f"its member {e.tarinfo.name!r} is a link, a device or outside the archive"
            else:  # an OSError's path is this host's business, its reason the caller's
                why = (e.strerror or type(e).__name__) if isinstance(e, OSError) else str(e)
            raise ModelSourceError(f"{tarball.name} is not a usable tar.gz: {why}") from None


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
    """NEURONSERVE_ENGINE, else the engine the build context was made for, else the
    first installed (`engines.default_engine`)."""
    engine = os.environ.get("NEURONSERVE_ENGINE")
    config = Path(os.environ.get("NEURONSERVE_CONFIG", CONFIG_FILE))
    if not engine and config.is_file():
        engine = json.loads(config.read_text()).get("engine")
    engine = engine or default_engine()
    if engine not in ENGINES:
        raise ModelSourceError(f"NEURONSERVE_ENGINE={engine!r}: use {' or '.join(ENGINES)}")
    return engine
