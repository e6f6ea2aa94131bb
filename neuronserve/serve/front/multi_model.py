"""SageMaker's multi-model contract, kept by the front: models registered at run time,
loaded onto every worker before they are listed as ready, evicted (least recently used
and idle first) when a worker's memory budget is spent, loaded again on their next
request, swapped under a served name without dropping a request.

The workers do the loading, in the processes that already hold the core groups (the
catalog folder, neuronserve/catalog.py). This class decides what they hold: one change at
a time (a lock), each model costing its memory estimate (placement.model_memory) against
the budget per worker.

A model's worker name is its name plus a version (`name@2` after a swap): requests
already on their way keep the version they looked up until it is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ... import catalog, placement
from ...artifact import ArtifactError, Manifest, read_manifest
from ...names import safe_name
from ...tasks import RequestError
from ..model_source import ModelSourceError, find_models, unpack_tar
from .config import LOAD_TIMEOUT_S
from .schemas import model_name

if TYPE_CHECKING:
    from collections import Counter

    from .model import ServedModel
    from .observe import FrontMetrics


class Routed(Protocol):
    """What the catalog needs of the routes' side (Serving): the models served by name,
    each model version's requests in flight and last use, and the metrics."""

    metrics: FrontMetrics
    models: dict[str, ServedModel]
    in_use: Counter[str]
    last_used: dict[str, float]

    def add(self, model: ServedModel) -> None: ...

    def forget(self, worker_name: str) -> None: ...


log = logging.getLogger("neuronserve.front")

LOADING, READY, EVICTED = "loading", "ready", "evicted"
# GET /models: models per page unless the caller asks for fewer
PAGE_SIZE = 100


class NoRoom(RequestError):
    """507: SageMaker's signal to unload models it no longer needs and try again."""

    def __init__(self, message: str):
        super().__init__(message, status=507)


@dataclass
class Registered:
    name: str
    url: str
    artifact: Path
    manifest: Manifest
    # the folder its archive was unpacked into (removed with it)
    work: Path
    # bytes one worker (one NeuronCore) holds of it
    cost: int
    version: int = 1
    state: str = EVICTED
    loads: int = 0
    last_used: float = field(default_factory=time.monotonic)
    loading: asyncio.Future[None] | None = None

    @property
    def key(self) -> str:
        """The name the workers hold this version under."""
        return self.name if self.version == 1 else f"{self.name}@{self.version}"

    def listed(self) -> dict[str, Any]:
        return {"modelName": self.name, "modelUrl": self.url, "state": self.state}


class ModelCatalog:
    """The registered models of a multi-model deployment and what every worker holds.

    `make(name, key, manifest, artifact)` builds the ServedModel the routes use; `serving`
    counts each model version's requests in flight (Serving.use)."""

    def __init__(  # noqa: PLR0913 - the deployment's facts, each one of its own
        self,
        serving: Routed,
        folder: Path,
        workers: int,
        kind: str,
        target: str,
        budget: int | None,
        make: Callable[[str, str, Manifest, Path], ServedModel],
        idle_unload_s: float | None = None,
    ):
        self.serving, self.folder, self.workers = serving, Path(folder), workers
        self.kind, self.target, self.budget = kind, target, budget
        self.make, self.idle_unload_s = make, idle_unload_s
        self.models: dict[str, Registered] = {}
        # worker name -> artifact, what every worker is told to hold
        self._wanted: dict[str, dict[str, Any]] = {}
        # one change to what the workers hold at a time
        self._lock = asyncio.Lock()
        # names being registered, and each name's lock while an operation holds it
        self._registering: set[str] = set()
        self._names: dict[str, tuple[asyncio.Lock, int]] = {}
        self._idle_task: asyncio.Task[None] | None = None

    # what the routes call

    async def register(self, name: str, url: str) -> Registered:
        """POST /models: 409 for a name registered or being registered, 507 when it
        cannot fit."""
        name = model_name(name)
        if name in self.models or name in self._registering:
            raise RequestError(f"model {name!r} is already loaded", status=409)
        self._registering.add(name)  # before any await: a second POST of it is a 409
        try:
            async with self._one_at_a_time(name):
                entry = await asyncio.to_thread(self._read, name, url, 1)
                self.models[name] = entry
                try:
                    await self._bring_in(entry)
                except BaseException:
                    if self.models.get(name) is entry:
                        del self.models[name]
                    _remove(entry.work)
                    raise
        finally:
            self._registering.discard(name)
        return entry

    async def swap(self, name: str, url: str) -> Registered:
        """PUT /models/<name>: load `url` beside the served version, send new requests to
        it once every worker holds it, then drop the old one when its requests are done."""
        name = model_name(name)
        async with self._one_at_a_time(name):
            old = self._get(name)
            new = await asyncio.to_thread(self._read, name, url, old.version + 1)
            try:
                async with self._lock:
                    await self._make_room(new.cost, keep=old)
                    await self._load(new)
                    self.models[name] = new
                    self._serve(new)
            except BaseException:
                _remove(new.work)
                raise
            async with self._lock:
                await self._drop(old)
            _remove(old.work)
        return new

    async def unregister(self, name: str) -> None:
        """DELETE /models/<name>: new requests get 404 at once; those in flight finish;
        its files and its metrics go with it."""
        name = model_name(name)
        async with self._one_at_a_time(name):
            entry = self._get(name)
            del self.models[name]
            self.serving.models.pop(name, None)
            async with self._lock:
                await self._drop(entry)
            _remove(entry.work)
            self.serving.metrics.forget_model(name)

    @contextlib.asynccontextmanager
    async def _one_at_a_time(self, name: str) -> AsyncIterator[None]:
        """Operations on one name (register, swap, unregister) run one after another, in
        the order they came: a DELETE during a load waits for the load, then unloads; a
        PUT after a DELETE finds nothing (404). The lock goes when nobody waits on it."""
        lock, users = self._names.get(name, (asyncio.Lock(), 0))
        self._names[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._names[name]
            if users == 1:
                del self._names[name]
            else:
                self._names[name] = (lock, users - 1)

    def describe(self, name: str) -> dict[str, Any]:
        return self._get(model_name(name)).listed()

    def page(self, token: str | None, size: int | None) -> dict[str, Any]:
        """GET /models: names in order, `size` a page, after the name `token` holds."""
        names = sorted(self.models)
        start = 0
        if token:
            start = next((i for i, n in enumerate(names) if n > token), len(names))
        size = min(size or PAGE_SIZE, PAGE_SIZE)
        chunk = names[start : start + size]
        out: dict[str, Any] = {"models": [self.models[n].listed() for n in chunk]}
        if start + size < len(names):
            out["nextPageToken"] = chunk[-1]
        return out

    async def ensure(self, name: str, waited: bool = True) -> None:
        """Return once `name` is on every worker: at once when it is, else after loading
        it (evicting others if needed); a request that waited is counted."""
        entry = self.models.get(name)
        if entry is None or entry.state == READY:
            return
        if waited:
            self.serving.metrics.model_waited.labels(name).inc()
        if entry.loading is None:
            entry.loading = asyncio.ensure_future(self._bring_in(entry))
        future = entry.loading
        try:
            await asyncio.shield(future)
        finally:
            if future.done() and entry.loading is future:
                entry.loading = None

    def states(self) -> dict[str, str]:
        return {n: e.state for n, e in self.models.items()}

    # loading and evicting

    def _get(self, name: str) -> Registered:
        entry = self.models.get(name)
        if entry is None:
            raise RequestError(
                f"no model {name!r} is loaded; loaded: {', '.join(sorted(self.models)) or 'none'}",
                status=404,
            )
        return entry

    def _read(self, name: str, url: str, version: int) -> Registered:
        """The artifact at `url` (a folder, or a .tar.gz of one as SageMaker hands it),
        unpacked within bounds into a folder of this version's own; nothing of it is left
        when it cannot be used, and no message names this host's folders."""
        work = self.folder / "sources" / f"{safe_name(name)}@{version}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            return self._unpacked(name, url, version, work)
        except RequestError as e:
            _remove(work)
            raise RequestError(self._public(e.message, work, url), e.status) from None
        except BaseException:
            _remove(work)
            raise

    def _unpacked(self, name: str, url: str, version: int, work: Path) -> Registered:
        source = Path(url)
        if not source.is_absolute():
            raise RequestError(
                f"url {url!r} is not an absolute path: give the artifact's folder (or its "
                ".tar.gz) as this host sees it, starting with /"
            )
        if not source.exists():
            raise RequestError(f"url {url!r}: no such file or folder on this host")
        tarballs = [source] if source.is_file() else sorted(source.glob("*.tar.gz"))
        if source.is_file() or (tarballs and not (source / "manifest.json").exists()):
            for tarball in tarballs:
                try:
                    unpack_tar(tarball, work / "unpacked", self.budget)
                except ModelSourceError as e:
                    raise RequestError(f"url {url!r}: {e}") from None
            source = work / "unpacked"
        try:
            found = find_models(source, work)
        except (ModelSourceError, ArtifactError) as e:
            raise RequestError(f"url {url!r}: {e}") from None
        if len(found) != 1:
            raise RequestError(f"url {url!r} holds {len(found)} models; load one at a time")
        try:
            manifest = read_manifest(found[0].artifact)
        except Exception as e:  # noqa: BLE001 - a broken artifact is the caller's to fix
            raise RequestError(f"url {url!r}: not a usable neuronserve artifact: {e}") from None
        if manifest.target != self.target:
            raise RequestError(
                f"url {url!r} is compiled for {manifest.target}; this endpoint's workers "
                f"run {self.target} models"
            )
        cost = placement.model_memory(name, manifest, found[0].artifact, self.kind).total
        return Registered(name, url, found[0].artifact, manifest, work, cost, version)

    def _public(self, message: str, work: Path, url: str) -> str:
        """`message` as a caller may read it: what was unpacked is named by the caller's
        url, and no other folder of this host's run folder is named."""
        message = message.replace(str(work / "unpacked"), url)
        return message.replace(str(work), "<unpacked>").replace(str(self.folder), "<catalog>")

    async def _bring_in(self, entry: Registered) -> None:
        async with self._lock:
            if self.models.get(entry.name) is not entry or entry.state == READY:
                return
            await self._make_room(entry.cost, keep=entry)
            await self._load(entry)
            if self.models.get(entry.name) is not entry:
                # unregistered (a DELETE) while the workers loaded it: off them again,
                # never served, so no ghost is listed
                await self._drop(entry)
                return
            self._serve(entry)

    async def _make_room(self, cost: int, keep: Registered) -> None:
        """Evict the least recently used idle models until `cost` more bytes fit; 507
        when even evicting every idle one would not make room."""
        if self.budget is None:
            return
        held = [e for e in self.models.values() if e.state == READY and e is not keep]
        used = sum(e.cost for e in held) + (keep.cost if keep.state == READY else 0)
        if used + cost <= self.budget:
            return
        idle = sorted((e for e in held if not self.serving.in_use[e.key]), key=self._last_used)
        freed, chosen = 0, []
        for e in idle:
            if used - freed + cost <= self.budget:
                break
            chosen.append(e)
            freed += e.cost
        if used - freed + cost > self.budget:
            mib = 2**20
            raise NoRoom(
                f"no room for {keep.name} ({cost / mib:.1f} MiB per worker): "
                f"{used / mib:.1f} of {self.budget / mib:.1f} MiB are held by models with "
                "requests in flight or too large to evict; unload a model, or raise "
                "memory_budget_mb"
            )
        for e in chosen:
            await self._evict(e, "to make room")

    async def _evict(self, entry: Registered, why: str) -> None:
        entry.state = EVICTED
        self.serving.models.pop(entry.name, None)
        self._wanted.pop(entry.key, None)
        await self._write_and_wait(lambda held: entry.key not in held)
        self.serving.forget(entry.key)
        self.serving.metrics.model_evictions.labels(entry.name).inc()
        self._count()
        log.info("evicted %s %s", entry.name, why)

    async def _load(self, entry: Registered) -> None:
        entry.state = LOADING
        started = time.monotonic()
        self._wanted[entry.key] = {"artifact": str(entry.artifact), "truncation": None}
        try:
            await self._write_and_wait(lambda held: held.get(entry.key) == catalog.READY, entry)
        except BaseException:
            entry.state = EVICTED
            self._wanted.pop(entry.key, None)
            catalog.write_wanted(self.folder, self._wanted)
            raise
        seconds = time.monotonic() - started
        entry.state, entry.loads = READY, entry.loads + 1
        entry.last_used = time.monotonic()
        self.serving.metrics.model_loads.labels(entry.name).inc()
        self.serving.metrics.model_load_seconds.labels(entry.name).inc(seconds)
        self._count()
        log.info(
            "loaded %s (%s) on %d worker(s) in %.2fs", entry.name, entry.key, self.workers, seconds
        )

    def _serve(self, entry: Registered) -> None:
        served = self.make(entry.name, entry.key, entry.manifest, entry.artifact)
        self.serving.add(served)

    async def _drop(self, entry: Registered) -> None:
        """Unload a version once no request holds it."""
        while self.serving.in_use[entry.key]:
            await asyncio.sleep(0.01)
        if entry.key in self._wanted:
            self._wanted.pop(entry.key)
            await self._write_and_wait(lambda held: entry.key not in held)
        self.serving.forget(entry.key)
        self._count()

    async def _write_and_wait(
        self, done: Callable[[dict[str, str]], bool], loading: Registered | None = None
    ) -> None:
        """Tell the workers, then wait until every live worker's state passes `done`
        (a failure to load is the caller's error, with the worker's reason)."""
        await asyncio.to_thread(catalog.write_wanted, self.folder, self._wanted)
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while True:
            states = await asyncio.to_thread(catalog.worker_states, self.folder)
            if loading is not None:
                for s in states:
                    why = s["models"].get(loading.key, "")
                    if why.startswith(catalog.FAILED):
                        why = why[len(catalog.FAILED) :]
                        raise RequestError(
                            f"{loading.name} failed to load on worker {s['group']}: "
                            f"{self._public(why, loading.work, loading.url)}",
                            status=500,
                        )
            if len(states) >= self.workers and all(done(s["models"]) for s in states):
                return
            if time.monotonic() > deadline:
                raise RequestError(
                    f"the workers did not finish within {LOAD_TIMEOUT_S:.0f}s "
                    f"({len(states)} of {self.workers} alive)",
                    status=500,
                )
            await asyncio.sleep(0.02)

    def _last_used(self, entry: Registered) -> float:
        return max(entry.last_used, self.serving.last_used.get(entry.key, 0.0))

    def _count(self) -> None:
        self.serving.metrics.models_loaded.set(sum(e.state == READY for e in self.models.values()))

    # idle unload

    def start(self) -> None:
        if self.idle_unload_s:
            self._idle_task = asyncio.ensure_future(self._unload_idle())

    async def _unload_idle(self) -> None:
        assert self.idle_unload_s
        while True:
            await asyncio.sleep(min(1.0, self.idle_unload_s / 4))
            now = time.monotonic()
            for entry in list(self.models.values()):
                if (
                    entry.state == READY
                    and not self.serving.in_use[entry.key]
                    and now - self._last_used(entry) > self.idle_unload_s
                ):
                    async with self._lock:
                        if entry.state == READY and not self.serving.in_use[entry.key]:
                            await self._evict(entry, f"after {self.idle_unload_s:g}s idle")

    async def close(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_task


def _remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
