"""Folders only this user may write, the one rule for every folder neuronserve keeps keys,
settings, pid files, leases, catalogs or engine stores in.

What lies in such a folder is read back as instructions (which model to load, which
handler to run, which key to accept), so a folder another local user can write, or any
folder above it that they can write, would let them rewrite those instructions: a user
who can write a parent can rename the folder away and put their own in its place. The
rule, as OpenSSH's StrictModes and sudo apply it to the files they trust:

- the folders neuronserve makes or owns (the run folder itself, and the levels a caller
  names as its own) are real folders, not symlinks, owned by this user, mode 0700: made
  so, or found so (one found more open is refused, never chmodded);
- every folder above them is owned by this user or by root (or, in a user namespace, by
  an owner outside it, which no user inside can be), and no other user can write it,
  unless it has the sticky bit (/tmp): there nobody can rename or remove what is not
  theirs.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


class NotPrivate(RuntimeError):
    """A folder (or one above it) that another local user owns or can write."""

    def __init__(self, path: Path, folder: Path, problem: str, above: bool = False):
        self.path, self.folder, self.problem = path, folder, problem
        where = f"{folder}" if folder == path else f"{path}: {folder}"
        if above:
            where = f"{path}: the folder {folder} above it"
        super().__init__(f"{where} {problem}")


def not_private(folder: Path) -> str | None:
    """What makes `folder` unfit to hold what only this user may write, or None: a
    symbolic link, not a directory, another user's, or writable by others."""
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not this user ({os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def shared_above(folder: Path) -> str | None:
    """What makes `folder`, above a private one, let another user replace what is in it,
    or None: owned by a user other than this one and root, or writable by others without
    the sticky bit."""
    st = os.stat(folder)
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in (0, os.getuid()) and not unmapped_owner(st.st_uid):
        return f"is owned by uid {st.st_uid}, not this user ({os.getuid()}) or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o}, no sticky bit)"
    return None


# where a user namespace says which of its ids are mapped, and which id it shows for an
# owner it does not map (user_namespaces(7))
UID_MAP = Path("/proc/self/uid_map")
OVERFLOW_UID = Path("/proc/sys/kernel/overflowuid")


def unmapped_owner(uid: int) -> bool:
    """Whether `uid` is the overflow id a user namespace shows for an owner outside it (a
    container's `/`, owned by the host's root, in a pod with its own user namespace): no
    process in this namespace can be that user, so, like root, no local user here can
    write or rename what it owns. On a host (every id mapped) it is just `nobody`."""
    try:
        overflow = int(OVERFLOW_UID.read_text())
        ranges = [[int(n) for n in line.split()] for line in UID_MAP.read_text().splitlines()]
    except (OSError, ValueError):
        return False
    mapped = any(len(r) == 3 and r[0] <= uid < r[0] + r[2] for r in ranges)
    return uid == overflow and not mapped


def private_folder(path: Path, own: int = 1) -> Path:
    """`path`, made if missing (0700, with any missing folders above it), and checked by
    the rule above: its last `own` levels are this user's own folders; every existing
    folder above them may be shared only as /tmp is. Raises NotPrivate naming the
    folder at fault."""
    path = Path(os.path.abspath(path))
    owned = [path, *path.parents][: max(own, 1)]
    top = owned[-1].parent
    existing = top
    while not existing.exists():
        existing = existing.parent
    real = Path(os.path.realpath(existing))
    for folder in [*reversed(real.parents), real]:
        problem = shared_above(folder)
        if problem:
            raise NotPrivate(path, folder, problem, above=True)
    # what is missing between that folder and the owned levels is made here: this user's
    made, folder = [], top
    while folder != existing:
        made.append(folder)
        folder = folder.parent
    for folder in [*reversed(made), *reversed(owned)]:
        created = False
        if not os.path.lexists(folder):
            # one made meanwhile is checked below like any other
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)
                created = True
        problem = not_private(folder)
        if problem is None and folder in owned and not created:
            problem = _open_to_others(folder)
        if problem:
            raise NotPrivate(path, folder, problem)
    return path


def _open_to_others(folder: Path) -> str | None:
    """What makes an existing folder, which neuronserve did not make, more open than
    0700: its mode is the owner's choice, never changed here (a typo such as
    `--run-dir /etc` must not take a folder from everyone else)."""
    mode = stat.S_IMODE(os.lstat(folder).st_mode)
    if mode & 0o077:
        return (
            f"is open to other users (mode {mode:o}; neuronserve changes the mode only of "
            "folders it makes)"
        )
    return None
