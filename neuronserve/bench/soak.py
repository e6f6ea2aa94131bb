"""neuronserve soak: a long mixed run against one served model, with a fault in the
middle, and what it left behind.

`requests` requests at `concurrency`, a `malformed` share of them broken on purpose
(not JSON, wrong types, empty inputs, over-long texts, non-UTF-8 bytes), the rest valid
bodies of one to three texts whose answers are checked against the Runner on the same
artifact in this process. At `kill_at` of the way through, one worker is sent SIGKILL.
Reported:

- answered (200 and equal to the Runner's answer), wrong (200 but not equal),
  unavailable (503 or 429 with Retry-After: refused; the client waits as told, at most
  5 s, before its next request, as a well-behaved client does),
  failed (any other status, a dropped connection, a timeout);
- malformed answered 4xx, and malformed answered otherwise (a defect);
- recovery: seconds from the kill until the workers are whole again, and until a probe
  beside the load (started at the kill) has had 20 valid requests in a row succeed,
  one at a time (given up 60 s after the kill);
- worker memory (RSS), sampled every second: each worker's first sample once it has
  served (10% of the requests done, or 5 s after it appeared, for a replacement) and its
  last; growth is judged on workers sampled over at least a third of the run;
- after stop: processes of the run still alive, core leases still held, temporary
  files left: anything in the temporary folder the run's servers were given (TMPDIR, a
  folder of the run's own) and the shared memory in /dev/shm its processes had open or
  named. Only the run's own:
  other servers on the host may come and go meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
import psutil

from ..pids import alive
from ..processes import ServeError

if TYPE_CHECKING:
    from ..spec import WorkerSection

__all__ = ["SoakTarget"]

SEQUENTIAL = 20
RETRY_CAP_S = 5.0
# a worker whose memory grows more than this after warm-up is leaking
MAX_GROWTH_PCT = 10.0
# seconds a worker started during the run has to load before its memory is sampled
LOAD_GRACE_S = 5.0
# how often each worker's memory is sampled: the growth figure is read from these samples
MEMORY_SAMPLE_S = 1.0
RECOVERY_LIMIT_S = 60.0
# texts of every kind a client sends: short, long, unicode, emoji, one character
TEXTS = [
    "hello",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "Serving encoders with one pinned worker per core keeps latency flat under load.",
    "naïve café déjà vu — Zürich, São Paulo, Kraków",
    "東京は日本の首都です。",
    "emoji 🚀🔥✨ in the middle 👩‍💻 of text",
    "x " * 40,
    "Inferentia and Trainium run compiled graphs; a bucket grid keeps padding small. " * 3,
    "Why is the sky blue? Rayleigh scattering of sunlight by the molecules of the air.",
]


@dataclass(frozen=True)
class SoakOptions:
    requests: int = 4000
    concurrency: int = 32
    malformed: float = 0.2
    # fraction of the requests after which one worker is killed; None: no kill
    kill_at: float | None = 0.4
    seed: int = 0
    timeout_s: float = 120.0


@dataclass
class SoakReport:
    target: str
    requests: int
    concurrency: int
    valid: int = 0
    answered: int = 0
    wrong: int = 0
    unavailable: int = 0
    failed: int = 0
    # requests lost with the killed worker
    lost_at_kill: int = 0
    # the most the kill may cost: none (the front sends a request whose worker died once
    # more, to a live one)
    lost_allowed: int | None = None
    malformed: int = 0
    malformed_4xx: int = 0
    malformed_not_4xx: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    killed_pid: int | None = None
    # when, in Unix time (to line the workers' own logs up with it)
    killed_at: float | None = None
    recovered_s: float | None = None
    sequential_ok_s: float | None = None
    sequential: str = ""
    memory_mb_warm: dict[str, float] = field(default_factory=dict)
    memory_mb_end: dict[str, float] = field(default_factory=dict)
    memory_growth_pct: float | None = None
    left_processes: list[int] = field(default_factory=list)
    left_leases: list[str] = field(default_factory=list)
    left_temp: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def defects(self) -> list[str]:
        """What should not have happened. Requests in flight when the worker was killed
        may be lost with it (at most `lost_allowed`); nothing else may fail."""
        out = []
        if self.wrong:
            out.append(f"{self.wrong} answer(s) differ from the Runner's")
        if self.malformed_not_4xx:
            out.append(f"{self.malformed_not_4xx} malformed request(s) not answered 4xx")
        if self.failed:
            out.append(f"{self.failed} valid request(s) failed")
        allowed = self.concurrency if self.lost_allowed is None else self.lost_allowed
        if self.lost_at_kill > allowed:
            out.append(
                f"{self.lost_at_kill} requests lost with the killed worker, more than {allowed}"
            )
        if self.killed_pid is not None and self.sequential_ok_s is None:
            out.append(f"only {self.sequential} sequential requests right within 60 s of the kill")
        if self.memory_growth_pct is not None and self.memory_growth_pct > MAX_GROWTH_PCT:
            out.append(f"a worker's memory grew {self.memory_growth_pct}% after warm-up")
        if self.left_processes or self.left_leases or self.left_temp:
            out.append("the stop left something behind")
        return out


@dataclass
class SoakTarget:
    """Where soak sends requests (the front's or SageMaker's /invocations: `{"inputs",
    "parameters"}` JSON, the task's JSON answer) and what it knows of the processes
    behind it."""

    label: str
    url: str
    roots: Callable[[], list[int]] = list
    workers_ready: Callable[[], tuple[int, int]] | None = None
    # what a killed worker may cost (SoakReport.lost_allowed); None: one per client
    lost_allowed: int | None = None
    # what every request carries besides its body (a key)
    headers: dict[str, str] = field(default_factory=dict)

    def workers(self) -> list[psutil.Process]:
        """The live worker processes under the target's root processes."""
        out: dict[int, psutil.Process] = {}
        for pid in self.roots():
            try:
                children = psutil.Process(pid).children(recursive=True)
            except psutil.Error:
                continue
            for p in children:
                try:
                    if p.status() == psutil.STATUS_ZOMBIE:
                        continue
                    cmd = " ".join(p.cmdline()[:3])
                except psutil.Error:
                    continue
                if WORKER_PROCESS in cmd:
                    out[p.pid] = p
        return [out[k] for k in sorted(out)]


def body(texts: list[str]) -> bytes:
    return json.dumps({"inputs": texts}).encode()


def malformed_bodies(max_text_chars: int) -> list[bytes]:
    """Bodies every server must refuse with a 4xx, its neighbours still served."""
    return [
        b"{not json",
        b"\xff\xfe\x00 not utf-8",
        b"[1, 2",
        b"",
        b'{"inputs": 5}',
        b'{"inputs": []}',
        b'{"inputs": [1, 2]}',
        b'{"inputs": {"a": "b"}}',
        b'{"inputs": "x", "parameters": {"truncate": "yes"}}',
        json.dumps({"inputs": "y" * (max_text_chars + 1)}).encode(),
        b'{"inputs": ' + b"[" * 200 + b"]" * 200 + b"}",
    ]


# what a worker process's command line holds
WORKER_PROCESS = "neuronserve.workers.worker"


class Checker:
    """The Runner's answer for each valid body, computed once in this process; a served
    answer must equal it (labels and strings exactly, numbers within `atol`)."""

    def __init__(self, artifact: Path):
        from ..runtime import Runner

        self.runner = Runner(artifact)
        self.atol = 1e-3 if self.runner.manifest.precision == "fp32" else 2e-2
        self.expected: dict[bytes, Any] = {}

    def add(self, texts: list[str]) -> bytes:
        sent = body(texts)
        if sent not in self.expected:
            answer = self.runner.responses_for_bodies([(sent, "application/json")])[0]
            self.expected[sent] = answer
        return sent

    def right(self, sent: bytes, data: bytes) -> bool:
        try:
            return _close(json.loads(data), self.expected[sent], self.atol)
        except (ValueError, KeyError, StopIteration, TypeError):
            return False


def _close(a: Any, b: Any, atol: float) -> bool:
    a, b = (x.tolist() if isinstance(x, np.ndarray) else x for x in (a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], atol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, atol) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) <= atol
    return bool(a == b)


async def _honour_retry_after(answer: tuple[int, bytes, Any]) -> None:
    """Wait as a well-behaved client would before its next request after a 503 or 429
    with Retry-After (at most RETRY_CAP_S): without it, the clients of a closed loop
    spin through the whole run in fast refusals while a worker is being replaced."""
    status, _, headers = answer
    if status in (429, 503):
        try:
            wait = float(headers.get("Retry-After", 0))
        except ValueError:
            wait = 0.0
        await asyncio.sleep(min(max(wait, 0.0), RETRY_CAP_S))


def memory_mb(workers: list[psutil.Process]) -> dict[str, float]:
    """Each live worker's resident memory (MiB). A killed worker not yet reaped (a
    zombie) holds none and reads 0: it is left out, or a growth judged against it would
    divide by zero (seen when the kill came within a second of the warm-up's end)."""
    out = {}
    for p in workers:
        with contextlib.suppress(psutil.Error):
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            out[str(p.pid)] = round(p.memory_info().rss / 2**20, 1)
    return out


def held_leases(directory: Path | None) -> list[str]:
    """Lease files in `directory` that some process still holds."""
    import fcntl

    held: list[str] = []
    if directory is None or not directory.is_dir():
        return held
    for path in sorted(directory.glob("*.lock")):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append(path.name)
        finally:
            os.close(fd)
    return held


def shared_memory_of(pids: set[int]) -> set[str]:
    """The /dev/shm entries `pids` have open or name on their command line."""
    found: set[str] = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            named = ["/dev/shm/" + os.path.basename(arg) for arg in proc.cmdline()]
            found |= {
                p
                for p in [*(f.path for f in proc.open_files()), *named]
                if p.startswith("/dev/shm/") and os.path.exists(p)
            }
    return found


class _Run:
    def __init__(self, options: SoakOptions, target: SoakTarget, checker: Checker, max_chars: int):
        self.o, self.target, self.checker = options, target, checker
        rng = random.Random(options.seed)
        valid = [checker.add(rng.sample(TEXTS, rng.randint(1, 3))) for _ in range(4 * len(TEXTS))]
        bad = malformed_bodies(max_chars)
        self.plan = [
            (True, rng.choice(bad))
            if rng.random() < options.malformed
            else (False, rng.choice(valid))
            for _ in range(options.requests)
        ]
        self.valid_bodies = valid
        self.report = SoakReport(target.label, options.requests, options.concurrency)
        self.latencies: list[float] = []
        self.statuses: Counter[str] = Counter()
        self.next = 0
        self.kill_time: float | None = None
        self.victim: psutil.Process | None = None
        self.warm = False
        self.on_sample: Callable[[], None] | None = None
        # pid -> (first seen, first warm sample time, first MiB, last MiB)
        self.memory: dict[str, list[float]] = {}

    def record(
        self, malformed: bool, body: bytes, answer: tuple[int, bytes, Any], t0: float
    ) -> None:
        r = self.report
        status, data, headers = answer
        self.statuses[str(status)] += 1
        killed = self.kill_time
        replacing = killed is not None and (t0 < killed or r.recovered_s is None)
        if replacing and (status == 0 or status >= 500):
            r.lost_at_kill += 1
            # what was lost and how (a dropped connection says which error closed it)
            self._sample(f"lost while the killed worker was replaced: {status} {data[:200]!r}")
            return
        if malformed:
            r.malformed += 1
            if 400 <= status < 500:
                r.malformed_4xx += 1
            else:
                r.malformed_not_4xx += 1
                self._sample(f"malformed {body[:60]!r} answered {status}: {data[:200]!r}")
            return
        r.valid += 1
        if status == 200:
            if self.checker.right(body, data):
                r.answered += 1
            else:
                r.wrong += 1
                self._sample(f"wrong answer for {body[:80]!r}: {data[:200]!r}")
        elif status in (429, 503) and headers.get("Retry-After"):
            r.unavailable += 1
        else:
            r.failed += 1
            self._sample(f"valid request answered {status}: {data[:200]!r}")

    def _sample(self, text: str) -> None:
        if len(self.report.samples) < 12:
            self.report.samples.append(text)

    async def send(self, session: aiohttp.ClientSession, body: bytes) -> tuple[int, bytes, Any]:
        try:
            async with session.post(
                self.target.url,
                data=body,
                headers={**self.target.headers, "Content-Type": "application/json"},
            ) as resp:
                return resp.status, await resp.read(), resp.headers
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            return 0, f"{type(e).__name__}: {e}".encode(), {}

    async def client(self, session: aiohttp.ClientSession) -> None:
        while self.next < len(self.plan):
            i = self.next
            self.next += 1
            if i == int(len(self.plan) * 0.1):
                self.warm = True
            if self.o.kill_at is not None and i == int(len(self.plan) * self.o.kill_at):
                self.kill()
            malformed, body = self.plan[i]
            t0 = time.monotonic()
            answer = await self.send(session, body)
            if answer[0] == 200:
                self.latencies.append((time.monotonic() - t0) * 1000)
            self.record(malformed, body, answer, t0)
            await _honour_retry_after(answer)

    def kill(self) -> None:
        workers = self.target.workers()
        if not workers:
            self._sample("no worker process found to kill")
            return
        victim = workers[0]
        with contextlib.suppress(psutil.Error):
            victim.send_signal(signal.SIGKILL)
            self.victim, self.report.killed_pid = victim, victim.pid
            self.kill_time, self.report.killed_at = time.monotonic(), round(time.time(), 3)

    async def sample_memory(self) -> None:
        seen: dict[str, float] = {}
        loaded: set[str] | None = None  # the workers already serving when the run began
        while True:
            now = time.monotonic()
            if self.on_sample is not None:
                await asyncio.to_thread(self.on_sample)
            try:
                sampled = await asyncio.to_thread(lambda: memory_mb(self.target.workers()))
            except Exception as e:  # noqa: BLE001 - a failed sample is reported, not fatal
                self._sample(f"memory sample failed: {type(e).__name__}: {e}")
                sampled = {}
            if loaded is None and sampled:
                loaded = set(sampled)
            for pid, mib in sampled.items():
                first = seen.setdefault(pid, now)
                if pid in self.memory:
                    self.memory[pid][3] = mib
                elif self.warm and (pid in (loaded or ()) or self._replacement_loaded(first, now)):
                    # a replacement worker is judged once it has loaded: its loading is
                    # not a leak (waiting so for every worker left short runs with none
                    # judged)
                    self.memory[pid] = [first, now, mib, mib]
            await asyncio.sleep(MEMORY_SAMPLE_S)

    def _replacement_loaded(self, first_seen: float, now: float) -> bool:
        """A worker that appeared during the run has loaded once it has had LOAD_GRACE_S
        and the front's client has called every worker ready again
        (on a busy host a load takes longer than any grace)."""
        ready = self.target.workers_ready is None or self.report.recovered_s is not None
        return ready and now - first_seen >= LOAD_GRACE_S

    def memory_report(self, wall_s: float) -> None:
        r, now = self.report, time.monotonic()
        r.memory_mb_warm = {pid: m[2] for pid, m in self.memory.items()}
        r.memory_mb_end = {pid: m[3] for pid, m in self.memory.items()}
        judged = [m for m in self.memory.values() if now - m[1] >= wall_s / 3]
        if judged:
            r.memory_growth_pct = round(max(100 * (m[3] / m[2] - 1) for m in judged), 1)

    async def watch_recovery(self) -> None:
        """Seconds from the kill until every worker is ready again, and
        a probe of its own beside the load: 20 valid requests in a row, one at a time."""
        while self.kill_time is None:
            await asyncio.sleep(0.05)
        probe = asyncio.create_task(self.sequential())
        ready, victim = self.target.workers_ready, self.victim
        if ready is not None and victim is not None:
            # first dead, then replaced: read in the other order, a worker still dying
            # would count as ready
            while alive(victim.pid) and time.monotonic() - self.kill_time < RECOVERY_LIMIT_S:
                await asyncio.sleep(0.05)
            while time.monotonic() - self.kill_time < RECOVERY_LIMIT_S:
                n, want = await asyncio.to_thread(ready)
                if n >= want:
                    self.report.recovered_s = round(time.monotonic() - self.kill_time, 2)
                    break
                await asyncio.sleep(0.2)
        await probe

    async def sequential(self) -> None:
        """20 valid requests in a row, one at a time, all right; after a kill, how long
        after it (given up 60 s after it), else at the end of the run."""
        start = self.kill_time or time.monotonic()
        streak, tried = 0, 0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            while time.monotonic() - start < RECOVERY_LIMIT_S and streak < SEQUENTIAL:
                body = self.valid_bodies[tried % len(self.valid_bodies)]
                tried += 1
                status, data, _ = await self.send(session, body)
                if status == 200 and self.checker.right(body, data):
                    streak += 1
                else:
                    streak = 0
                    await asyncio.sleep(0.1)
        self.report.sequential = f"{streak}/{SEQUENTIAL}"
        if streak == SEQUENTIAL:
            self.report.sequential_ok_s = round(time.monotonic() - start, 2)

    async def run(self) -> SoakReport:
        timeout = aiohttp.ClientTimeout(total=self.o.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.o.concurrency)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            watch = asyncio.create_task(self.watch_recovery())
            sampler = asyncio.create_task(self.sample_memory())
            t0 = time.monotonic()
            await asyncio.gather(*(self.client(session) for _ in range(self.o.concurrency)))
            self.report.wall_s = round(time.monotonic() - t0, 2)
            sampler.cancel()
            self.memory_report(self.report.wall_s)
            if self.kill_time is not None:
                await watch
            else:
                watch.cancel()
                await self.sequential()
        r = self.report
        r.statuses = dict(sorted(self.statuses.items()))
        if self.latencies:
            r.p50_ms = round(float(np.percentile(self.latencies, 50)), 2)
            r.p99_ms = round(float(np.percentile(self.latencies, 99)), 2)
        return r


def run_soak(
    options: SoakOptions,
    target: SoakTarget,
    artifact: Path,
    max_text_chars: int = 100_000,
    on_sample: Callable[[], None] | None = None,
) -> SoakReport:
    """Drive `target` (already serving `artifact`) with the soak mix; `on_sample` is
    called beside each memory sample (once a second, off the event loop)."""
    checker = Checker(artifact)
    run = _Run(options, target, checker, max_text_chars)
    run.on_sample = on_sample
    return asyncio.run(run.run())


def after_stop(
    report: SoakReport, pids: set[int], lease_dir: Path | None, temp_dir: Path, shm: set[str]
) -> None:
    """What the run left behind once its servers were stopped: its processes, leases,
    anything in its servers' temporary folder, the shared memory `shm` they used."""
    report.left_processes = [pid for pid in sorted(pids) if alive(pid)]
    report.left_leases = held_leases(lease_dir)
    left = [str(p) for p in temp_dir.iterdir()] if temp_dir.is_dir() else []
    report.left_temp = sorted(left + [p for p in shm if os.path.lexists(p)])


def format_report(r: SoakReport) -> str:
    lines = [
        f"soak of {r.target}: {r.requests} requests at concurrency {r.concurrency} "
        f"in {r.wall_s:.1f}s (p50 {r.p50_ms} ms, p99 {r.p99_ms} ms of the answered)",
        f"  valid      {r.valid}: answered right {r.answered}, wrong {r.wrong}, "
        f"unavailable (503/429 + Retry-After) {r.unavailable}, failed {r.failed}; "
        f"lost with the killed worker {r.lost_at_kill}"
        + (f" (at most {r.lost_allowed} allowed)" if r.lost_allowed is not None else ""),
        f"  malformed  {r.malformed}: 4xx {r.malformed_4xx}, not 4xx {r.malformed_not_4xx}",
        f"  statuses   {r.statuses}",
    ]
    if r.killed_pid is not None:
        lines.append(
            f"  kill       worker pid {r.killed_pid}: workers whole again after "
            f"{r.recovered_s if r.recovered_s is not None else 'never (60 s)'} s; "
            f"{r.sequential} sequential requests right"
            + (f" {r.sequential_ok_s} s after the kill" if r.sequential_ok_s is not None else "")
        )
    else:
        lines.append(f"  sequential {r.sequential} right after the run")
    lines.append(
        f"  memory     first warm sample {r.memory_mb_warm} MiB, last {r.memory_mb_end} MiB"
        + (
            f": largest growth {r.memory_growth_pct}%"
            if r.memory_growth_pct is not None
            else ": not judged (no worker sampled over a third of the run)"
        )
    )
    lines.append(
        f"  after stop processes {r.left_processes or 'none'}, leases held "
        f"{r.left_leases or 'none'}, temporary files {r.left_temp or 'none'}"
    )
    lines += [f"  sample: {s}" for s in r.samples]
    return "\n".join(lines)


VIAS = ("front", "sagemaker")


def start_target(
    artifact: Path, via: str, worker: WorkerSection | None = None
) -> tuple[Any, SoakTarget]:
    """Start neuronserve serving `artifact` through the front (`serve front`) or through
    the SageMaker entrypoint, its workers as `worker` says; return the server and its
    SoakTarget."""
    from ..artifact import read_manifest
    from .servers import FrontServer, SageMakerServer

    manifest = read_manifest(artifact, verify=False)
    layout = worker.layout if worker is not None else "throughput"
    server: Any
    if via == "front":
        server = FrontServer(artifact, layout, worker)
    elif via == "sagemaker":
        server = SageMakerServer(artifact, layout)
    else:
        raise ValueError(f"via {via!r}: one of {', '.join(VIAS)}")
    server.start()
    try:
        return server, _target(server, via, manifest)
    except BaseException:
        server.stop()  # a server this run started never outlives it
        raise


def _target(server: Any, via: str, manifest: Any) -> SoakTarget:
    from ..serve.deployment import RUN_DIR

    run_dir = server.workers_work / RUN_DIR
    return SoakTarget(
        label=f"neuronserve via {via}",
        url=f"{server.url}/invocations" if via == "front" else server.url,
        roots=server.root_pids,
        workers_ready=_ready_workers(run_dir, manifest.name, server.workers),
        lost_allowed=0,
    )


def _ready_workers(run_dir: Path, model: str, workers: int) -> Callable[[], tuple[int, int]]:
    """(workers ready, `workers` planned), as the front's client of the workers counts
    them (the workers gone: none)."""
    from ..workers.client import SocketClient

    async def ask() -> tuple[int, int]:
        client = SocketClient(model, run_dir, workers)
        try:
            counts = await client.health()
        finally:
            await client.close()
        return counts.ready, counts.expected

    def ready() -> tuple[int, int]:
        try:
            return asyncio.run(ask())
        except ServeError:
            return 0, workers

    return ready


@contextlib.contextmanager
def _own_temp_folder() -> Iterator[Path]:
    """A temporary folder for the run's servers (TMPDIR, which they inherit), so that
    what they leave is told apart from what other processes on the host write."""
    folder = Path(tempfile.mkdtemp(prefix="ns-soak-"))
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), None
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        tempfile.tempdir = None
        shutil.rmtree(folder, ignore_errors=True)


def soak_started(
    artifact: Path,
    worker: WorkerSection,
    via: str,
    options: SoakOptions,
    log: Callable[[str], object] = print,
) -> SoakReport:
    """Start neuronserve for `artifact` (`via` front or sagemaker), soak it, stop it and
    report what the stop left behind: processes of the run, leases, temporary files."""
    with _own_temp_folder() as temp_dir:
        log(f"starting neuronserve via {via} for {artifact} ...")
        server, target = start_target(artifact, via, worker)
        pids: set[int] = set()
        shm: set[str] = set()

        def seen() -> None:
            for root in target.roots():
                pids.add(root)
                with contextlib.suppress(psutil.Error):
                    pids.update(p.pid for p in psutil.Process(root).children(recursive=True))
            shm.update(shared_memory_of(pids))

        try:
            seen()
            log(f"soaking {target.url}: {options.requests} requests, {options.concurrency} clients")
            report = run_soak(options, target, artifact, on_sample=seen)
            report.lost_allowed = target.lost_allowed
            seen()
        finally:
            server.stop(cleanup=False)
        server.tmp.cleanup()  # the run's own working folder, inside temp_dir
        after_stop(report, pids, server.lease_dir, temp_dir, shm)
    return report
