"""The table of served models: the front's, and the only place that says which models
it serves and in what state.

Each name has the version new requests get and, after a swap, older versions that finish
the requests already holding them. A version has a state (loading, ready, evicted), its
memory cost on each worker and the requests holding it: a request holds the version it
looked up until it is answered, so an eviction, a swap or a DELETE never pulls a model
from under a request. A fixed deployment's models are pinned versions (ready from the
start, never evicted); a multi-model deployment's registered ones change through its
policies (multi_model.py: loading, least-recently-used eviction, idle unload, swaps),
which read and change this table and nothing else. What the workers hold follows from
it (`wanted`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...artifact import Manifest
    from ...served import ServedModel

LOADING, READY, EVICTED = "loading", "ready", "evicted"


@dataclass(eq=False)
class Version:
    """One version of a served name: what the workers hold it as (`key`), its state and
    cost, and who holds it."""

    name: str
    manifest: Manifest
    artifact: Path | None = None
    # bytes one worker (one core group) holds of it
    cost: int = 0
    number: int = 1
    pinned: bool = False
    state: str = EVICTED
    # what the routes use once it is ready
    served: ServedModel | None = None
    holds: int = 0
    last_used: float = field(default_factory=time.monotonic)
    loads: int = 0
    # a load under way that requests wait on (multi-model: loaded on first use)
    loading: asyncio.Future[None] | None = None
    # registered at run time: where it came from, and the folder it was unpacked into
    url: str = ""
    work: Path | None = None

    @property
    def key(self) -> str:
        """The name the workers hold this version under."""
        return self.name if self.number == 1 else f"{self.name}@{self.number}"

    @property
    def idle(self) -> bool:
        return self.holds == 0

    def listed(self) -> dict[str, Any]:
        return {"modelName": self.name, "modelUrl": self.url, "state": self.state}


class ModelTable:
    """Name -> the version new requests get, and every version still held somewhere."""

    def __init__(self) -> None:
        self._current: dict[str, Version] = {}
        # by worker key: the current versions and the older ones still draining
        self._all: dict[str, Version] = {}

    # what is served

    def __contains__(self, name: object) -> bool:
        return name in self._current

    def __iter__(self) -> Iterator[Version]:
        return iter(list(self._current.values()))

    def __len__(self) -> int:
        return len(self._current)

    def get(self, name: str) -> Version | None:
        return self._current.get(name)

    def names(self) -> list[str]:
        return list(self._current)

    def served(self) -> dict[str, ServedModel]:
        """What a request can be routed to now: each name's version, when it is ready."""
        return {
            n: v.served
            for n, v in self._current.items()
            if v.state == READY and v.served is not None
        }

    def states(self) -> dict[str, str]:
        return {n: v.state for n, v in self._current.items()}

    def versions(self) -> list[Version]:
        """Every version, current or draining."""
        return list(self._all.values())

    def wanted(self) -> dict[str, Version]:
        """What every worker is to hold: the versions loaded or loading, by worker key."""
        return {k: v for k, v in self._all.items() if v.state in (LOADING, READY)}

    # changes

    def pin(self, model: ServedModel) -> Version:
        """A fixed deployment's model: ready from the start, never evicted."""
        version = Version(model.name, model.manifest, pinned=True, state=READY, served=model)
        self.put(version)
        return version

    def stage(self, version: Version) -> None:
        """`version` on its way onto the workers beside its name's current one, which
        requests keep getting until `put`."""
        self._all[version.key] = version

    def put(self, version: Version) -> None:
        """`version` is what requests for its name get from now on (the one it replaces
        stays until `drop`)."""
        self._current[version.name] = version
        self._all[version.key] = version

    def ready(self, version: Version, served: ServedModel) -> None:
        version.state, version.served = READY, served
        version.loads += 1
        version.last_used = time.monotonic()

    def remove(self, name: str) -> Version | None:
        """`name` no longer served: new requests get 404; its versions stay until each
        is dropped."""
        return self._current.pop(name, None)

    def drop(self, version: Version) -> None:
        """Gone from the workers: forgotten."""
        if self._all.get(version.key) is version:
            del self._all[version.key]

    # holds

    def hold(self, version: Version) -> Version:
        version.holds += 1
        return version

    def release(self, version: Version) -> None:
        version.holds -= 1
        version.last_used = time.monotonic()

    async def drained(self, version: Version, poll_s: float = 0.01) -> None:
        """Once no request holds `version`."""
        while version.holds:
            await asyncio.sleep(poll_s)

    def least_recently_used(self, but: Version | None = None) -> list[Version]:
        """Evictable versions, the longest unused first: loaded, not pinned, held by no
        request."""
        idle = [
            v
            for v in self._all.values()
            if v.state == READY and not v.pinned and v.idle and v is not but
        ]
        return sorted(idle, key=lambda v: v.last_used)
