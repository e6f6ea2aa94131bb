"""Where models are read from before they are served: a model found in a folder or a
store (`FoundModel`), archives unpacked within bounds (a folder of several shares one
bound), and the error for a source that holds no usable model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from .spec import ModelEntry


class ModelSourceError(RuntimeError):
    pass


@dataclass(frozen=True)
class FoundModel:
    artifact: Path
    name: str
    # what it was packaged with (a .mar's or a Triton repository's): what the user gave
    # at packaging time must survive packaging again for this host
    truncation: bool | None = None

    def entry(self) -> ModelEntry:
        return ModelEntry(artifact=self.artifact, name=self.name, truncation=self.truncation)


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

        existing = Path(work)  # what the caller will make, on the disk it will be on
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free = shutil.disk_usage(existing).free - DISK_MARGIN
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


class _NotPlain(Exception):
    """A member tarfile's "data" filter would refuse (its name in args[0])."""


def _plain_member(member: Any, dest: Path) -> Any:
    """`member` as tarfile's "data" filter passes it, on a Python without the filters
    (3.10 before 3.10.12, 3.11 before 3.11.4: Debian bookworm's 3.11.2): only files and
    folders, inside `dest`, with no set-id bits and nobody else's write; else _NotPlain."""
    inside = (dest / member.name).resolve()
    if not (member.isfile() or member.isdir()) or member.name.startswith("/"):
        raise _NotPlain(member.name)
    if inside != dest.resolve() and dest.resolve() not in inside.parents:
        raise _NotPlain(member.name)
    member.mode &= 0o755
    member.uid = member.gid = 0  # as root, owned by root, never by the archive's ids
    member.uname = member.gname = ""
    return member


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
                    if hasattr(tarfile, "data_filter"):
                        t.extract(member, dest, filter="data")
                    else:
                        t.extract(_plain_member(member, dest), dest)
        except (tarfile.TarError, OSError, ModelSourceError, _NotPlain) as e:
            shutil.rmtree(dest, ignore_errors=True)
            if isinstance(e, ModelSourceError):
                raise
            if isinstance(e, (_NotPlain, getattr(tarfile, "FilterError", _NotPlain))):
                # FilterError: its member is the one refused
                name = e.args[0] if isinstance(e, _NotPlain) else cast(Any, e).tarinfo.name
                why = f"its member {name!r} is a link, a device or outside the archive"
            else:  # an OSError's path is this host's business, its reason the caller's
                why = (e.strerror or type(e).__name__) if isinstance(e, OSError) else str(e)
            raise ModelSourceError(f"{tarball.name} is not a usable tar.gz: {why}") from None
