"""SageMaker's multi-model contract: the policies over the front's table of served
models (table.py) for models registered at run time. A registered model is loaded onto
every worker before it is listed as ready, evicted (least recently used and idle first)
when a worker's memory budget is spent, loaded again on its next request, and swapped
under its name without dropping a request.

The workers do the loading, in the processes that already hold the core groups: this
module writes what the table wants held into the catalog folder (neuronserve/catalog.py)
and waits until every worker holds it. One change to what the workers hold at a time (a
lock), one operation on a name at a time (a lock per name), each model costing its
memory estimate (placement.model_memory) against the budget per worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ... import catalog, placement
from ...artifact import ArtifactError, Manifest, read_manifest
from ...names import safe_name
from ...processes import private_dir
from ...sources import ModelSourceError, unpack_tar
from ...tasks import RequestError
from ...waiting import until_async
from ..model_source import find_models
from .config import LOAD_TIMEOUT_S
from .schemas import model_name
from .table import EVICTED, LOADING, READY, ModelTable, Version

if TYPE_CHECKING:
    from ...served import ServedModel
    from .observe import FrontMetrics


class Routed(Protocol):
    """What the policies need of the routes' side (Serving): the table and the metrics."""

    metrics: FrontMetrics
    table: ModelTable


log = logging.getLogger("neuronserve.front")

# GET /models: models per page unless the caller asks for fewer
PAGE_SIZE = 100


class NoRoom(RequestError):
    """507: SageMaker's signal to unload models it no longer needs and try again."""

    def __init__(self, message: str):
        super().__init__(message, status=507)


class ModelCatalog:
    """A multi-model deployment's registrations, loads, evictions and swaps, all over
    `serving.table`.

    `make(name, key, manifest, artifact)` builds the ServedModel the routes use."""

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
        self.table = serving.table
        # one change to what the workers hold at a time
        self._lock = asyncio.Lock()
        # names being registered, and each name's lock while an operation holds it
        self._registering: set[str] = set()
        self._names: dict[str, tuple[asyncio.Lock, int]] = {}
        self._idle_task: asyncio.Task[None] | None = None

    # what the routes call

    async def register(self, name: str, url: str) -> Version:
        """POST /models: 409 for a name registered or being registered, 507 when it
        cannot fit."""
        name = model_name(name)
        if name in self.table or name in self._registering:
            raise RequestError(f"model {name!r} is already loaded", status=409)
        self._registering.add(name)  # before any await: a second POST of it is a 409
        try:
            async with self._one_at_a_time(name):
                version = await asyncio.to_thread(self._read, name, url, 1)
                self.table.put(version)
                try:
                    await self._bring_in(version)
                except BaseException:
                    if self.table.get(name) is version:
                        self.table.remove(name)
                    self.table.drop(version)
                    _remove(version.work)
                    raise
        finally:
            self._registering.discard(name)
        return version

    async def swap(self, name: str, url: str) -> Version:
        """PUT /models/<name>: load `url` beside the served version, send new requests to
        it once every worker holds it, then drop the old one when its requests are done."""
        name = model_name(name)
        async with self._one_at_a_time(name):
            old = self._get(name)
            new = await asyncio.to_thread(self._read, name, url, old.number + 1)
            try:
                async with self._lock:
                    await self._make_room(new.cost, keep=old)
                    self.table.stage(new)
                    await self._load(new)
                    self.table.put(new)
                    self._serve(new)
            except BaseException:
                self.table.drop(new)
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
            version = self._get(name)
            self.table.remove(name)
            async with self._lock:
                await self._drop(version)
            _remove(version.work)
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
        names = sorted(self.table.names())
        start = 0
        if token:
            start = next((i for i, n in enumerate(names) if n > token), len(names))
        size = min(size or PAGE_SIZE, PAGE_SIZE)
        chunk = names[start : start + size]
        out: dict[str, Any] = {"models": [self._get(n).listed() for n in chunk]}
        if start + size < len(names):
            out["nextPageToken"] = chunk[-1]
        return out

    async def ensure(self, name: str, waited: bool = True) -> None:
        """Return once `name` is on every worker: at once when it is, else after loading
        it (evicting others if needed); a request that waited is counted."""
        version = self.table.get(name)
        if version is None or version.state == READY:
            return
        if waited:
            self.serving.metrics.model_waited.labels(name).inc()
        if version.loading is None:
            version.loading = asyncio.ensure_future(self._bring_in(version))
        future = version.loading
        try:
            await asyncio.shield(future)
        finally:
            if future.done() and version.loading is future:
                version.loading = None

    # loading and evicting

    def _get(self, name: str) -> Version:
        version = self.table.get(name)
        if version is None:
            raise RequestError(
                f"no model {name!r} is loaded; loaded: "
                f"{', '.join(sorted(self.table.names())) or 'none'}",
                status=404,
            )
        return version

    def _read(self, name: str, url: str, version: int) -> Version:
        """The artifact at `url` (a folder, or a .tar.gz of one as SageMaker hands it),
        unpacked within bounds into a folder of this version's own; nothing of it is left
        when it cannot be used, and no message names this host's folders."""
        work = self.folder / "sources" / f"{safe_name(name)}@{version}"
        shutil.rmtree(work, ignore_errors=True)
        private_dir(work)
        try:
            return self._unpacked(name, url, version, work)
        except RequestError as e:
            _remove(work)
            raise RequestError(self._public(e.message, work, url), e.status) from None
        except BaseException:
            _remove(work)
            raise

    def _unpacked(self, name: str, url: str, version: int, work: Path) -> Version:
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
            try:
                unpack_tar(tarballs, work / "unpacked", self.budget)
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
        return Version(name, manifest, found[0].artifact, cost, version, url=url, work=work)

    def _public(self, message: str, work: Path | None, url: str) -> str:
        """`message` as a caller may read it: what was unpacked is named by the caller's
        url, and no other folder of this host's run folder is named."""
        if work is not None:
            message = message.replace(str(work / "unpacked"), url)
            message = message.replace(str(work), "<unpacked>")
        return message.replace(str(self.folder), "<catalog>")

    async def _bring_in(self, version: Version) -> None:
        async with self._lock:
            if self.table.get(version.name) is not version or version.state == READY:
                return
            await self._make_room(version.cost, keep=version)
            self.serving.metrics.serving(version.key)
            await self._load(version)
            if self.table.get(version.name) is not version:
                # unregistered (a DELETE) while the workers loaded it: off them again,
                # never served, so no ghost is listed
                await self._drop(version)
                return
            self._serve(version)

    async def _make_room(self, cost: int, keep: Version) -> None:
        """Evict the least recently used idle models until `cost` more bytes fit; 507
        when even evicting every idle one would not make room."""
        if self.budget is None:
            return
        used = sum(v.cost for v in self.table.versions() if v.state == READY)
        if used + cost <= self.budget:
            return
        freed, chosen = 0, []
        for v in self.table.least_recently_used(but=keep):
            if used - freed + cost <= self.budget:
                break
            chosen.append(v)
            freed += v.cost
        if used - freed + cost > self.budget:
            mib = 2**20
            raise NoRoom(
                f"no room for {keep.name} ({cost / mib:.1f} MiB per worker): "
                f"{used / mib:.1f} of {self.budget / mib:.1f} MiB are held by models with "
                "requests in flight or too large to evict; unload a model, or raise "
                "memory_budget_mb"
            )
        for v in chosen:
            await self._evict(v, "to make room")

    async def _evict(self, version: Version, why: str) -> None:
        version.state = EVICTED
        await self._write_and_wait(lambda held: version.key not in held)
        self.serving.metrics.model_evictions.labels(version.name).inc()
        self._count()
        log.info("evicted %s %s", version.name, why)

    async def _load(self, version: Version) -> None:
        version.state = LOADING
        started = time.monotonic()
        try:
            await self._write_and_wait(lambda held: held.get(version.key) == catalog.READY, version)
        except BaseException:
            version.state = EVICTED
            await asyncio.to_thread(catalog.write_wanted, self.folder, self._wanted())
            raise
        seconds = time.monotonic() - started
        self.serving.metrics.model_loads.labels(version.name).inc()
        self.serving.metrics.model_load_seconds.labels(version.name).inc(seconds)
        log.info(
            "loaded %s (%s) on %d worker(s) in %.2fs",
            version.name,
            version.key,
            self.workers,
            seconds,
        )

    def _serve(self, version: Version) -> None:
        assert version.artifact is not None  # registered: always unpacked somewhere
        served = self.make(version.name, version.key, version.manifest, version.artifact)
        self.table.ready(version, served)
        self._count()

    async def _drop(self, version: Version) -> None:
        """Unload a version once no request holds it; the workers' metrics of it are
        no longer passed on."""
        await self.table.drained(version)
        if version.state != EVICTED:
            version.state = EVICTED
            await self._write_and_wait(lambda held: version.key not in held)
        self.table.drop(version)
        self.serving.metrics.dropped(version.key)
        self._count()

    def _wanted(self) -> dict[str, dict[str, Any]]:
        return {
            key: {"artifact": str(v.artifact), "truncation": None}
            for key, v in self.table.wanted().items()
        }

    async def _write_and_wait(
        self, done: Callable[[dict[str, str]], bool], loading: Version | None = None
    ) -> None:
        """Tell the workers what the table wants held, then wait until every live
        worker's state passes `done` (a failure to load is the caller's error, with the
        worker's reason)."""
        await asyncio.to_thread(catalog.write_wanted, self.folder, self._wanted())
        alive = 0

        async def passed() -> bool:
            nonlocal alive
            states = await asyncio.to_thread(catalog.worker_states, self.folder)
            alive = len(states)
            if loading is not None:
                self._failed_load(loading, states)
            return alive >= self.workers and all(done(s["models"]) for s in states)

        if not await until_async(passed, LOAD_TIMEOUT_S, 0.02):
            raise RequestError(
                f"the workers did not finish within {LOAD_TIMEOUT_S:.0f}s "
                f"({alive} of {self.workers} alive)",
                status=500,
            )

    def _failed_load(self, loading: Version, states: list[dict[str, Any]]) -> None:
        """A worker that could not load `loading`: the caller's error, with its reason."""
        for s in states:
            why = s["models"].get(loading.key, "")
            if why.startswith(catalog.FAILED):
                why = why[len(catalog.FAILED) :]
                raise RequestError(
                    f"{loading.name} failed to load on worker {s['group']}: "
                    f"{self._public(why, loading.work, loading.url)}",
                    status=500,
                )

    def _count(self) -> None:
        self.serving.metrics.models_loaded.set(sum(v.state == READY for v in self.table))

    # idle unload

    def start(self) -> None:
        if self.idle_unload_s:
            self._idle_task = asyncio.ensure_future(self._unload_idle())

    async def _unload_idle(self) -> None:
        assert self.idle_unload_s
        while True:
            await asyncio.sleep(min(1.0, self.idle_unload_s / 4))
            idle_since = time.monotonic() - self.idle_unload_s
            for version in self.table.least_recently_used():
                if version.last_used >= idle_since:
                    break
                async with self._lock:
                    if version.state == READY and version.idle:
                        await self._evict(version, f"after {self.idle_unload_s:g}s idle")

    async def close(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_task


def _remove(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
