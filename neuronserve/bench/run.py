"""`neuronserve bench`: sweep sequence length x texts per request x concurrency over
one or more endpoints, one endpoint at a time, and summarise every point the same way.

Endpoint specs (`--endpoint`, repeatable), `TYPE:WHERE`, optionally `LABEL=TYPE:WHERE`:

    front:ARTIFACT             start `serve front` on the artifact (per --layouts);
                               measure /invocations, /embed and /v1/embeddings through
                               it, on the same processes (front-native: the same)
    sagemaker:ARTIFACT         start the SageMaker entrypoint
    runner:ARTIFACT            the Runner in this process (no server)
    vanilla:MODEL_DIR          the transformers pipeline on the eager model (the baseline)
    sagemaker:http://...       .../invocations
    openai:http://...          any server's OpenAI-compatible embeddings URL
"""

from __future__ import annotations

import functools
import json
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from ..artifact import MANIFEST, read_manifest
from ..host_load import NeuronMonitor
from ..load.endpoints import Endpoint, HttpJsonEndpoint, RunnerEndpoint, VanillaEndpoint
from ..load.generator import LoadResult, Window, run_load
from ..load.work import Work, mask_token
from .floor import encoder_gflop, peak_gops
from .servers import (
    FrontServer,
    SageMakerServer,
    cpu_by_role,
    keep_logs,
    model_ms,
)
from .stats import summarize
from .texts import text_with_tokens

if TYPE_CHECKING:
    from ..spec import WorkerSection

# the front, as `front`, and as `front-native`, the name earlier BENCHMARKS commands used
FRONTS = ("front", "front-native")
# the servers bench starts itself
MANAGED = (*FRONTS, "sagemaker")
# openai: any server's OpenAI-compatible embeddings URL (a peer such as infinity-emb or
# text-embeddings-inference), driven with the same texts and load as ours
TYPES = (*MANAGED, "runner", "vanilla", "openai")


@dataclass
class EndpointSpec:
    label: str
    type: str
    where: str


def parse_endpoint(text: str) -> EndpointSpec:
    label = None
    if "=" in text.split(":", 1)[0]:
        label, text = text.split("=", 1)
    type_, sep, where = text.partition(":")
    if not sep or not where:
        raise ValueError(f"endpoint {text!r}: expected TYPE:WHERE, e.g. front:artifacts/m")
    if type_ not in TYPES:
        raise ValueError(f"endpoint {text!r}: unknown type {type_!r}; choose from {TYPES}")
    return EndpointSpec(label or type_, type_, where)


@dataclass
class BenchConfig:
    endpoints: list[EndpointSpec]
    sequence_lengths: list[int]
    texts_per_request: list[int] = field(default_factory=lambda: [1])
    concurrency: list[int] = field(default_factory=lambda: [1])
    layouts: list[str] = field(default_factory=lambda: ["throughput"])
    window: Window = field(default_factory=Window)
    # load on each started server before its first point, unmeasured
    server_warmup_s: float = 0.0
    # the workers and batching of the servers bench starts (the command's)
    worker: WorkerSection | None = None
    headers: dict[str, str] = field(default_factory=dict)
    tokenizer: Path | None = None  # tokenizer.json that counts tokens (default: an artifact's)
    task: str | None = None
    # what drives the HTTP points: "wrk" (C, one thread), "python" (this process, one
    # event loop), "auto" (wrk where it is installed)
    generator: str = "auto"
    # with the python generator: cross-check the first HTTP JSON endpoint with wrk at
    # (wrk_seq, 1 text, largest concurrency)
    wrk: bool = True
    wrk_seq: int | None = None
    # where a started server's logs are kept when a point measured on it had errors (its
    # temporary folder goes with its stop): None keeps none
    logs: Path | None = None

    def drives_with_wrk(self) -> bool:
        from ..load import wrk

        if self.generator not in GENERATORS:
            raise ValueError(f"unknown load generator {self.generator!r}: {GENERATORS}")
        if self.generator == "wrk" and not wrk.available():
            raise ValueError("--generator wrk: wrk is not installed (apt-get install wrk)")
        return self.generator == "wrk" or (self.generator == "auto" and wrk.available())


GENERATORS = ("auto", "wrk", "python")


def _is_url(where: str) -> bool:
    return where.startswith("http://")


def _tokenizer_file(config: BenchConfig) -> Path:
    if config.tokenizer:
        return Path(config.tokenizer)
    for e in config.endpoints:
        p = Path(e.where)
        for candidate in (p / "tokenizer.json",):
            if candidate.is_file():
                return candidate
    raise ValueError(
        "no tokenizer to count tokens with: pass --tokenizer path/to/tokenizer.json "
        "or include a local artifact or model directory"
    )


def _task(config: BenchConfig) -> str:
    if config.task:
        return config.task
    for e in config.endpoints:
        manifest = Path(e.where) / MANIFEST
        if manifest.is_file():
            return json.loads(manifest.read_text())["task"]
    raise ValueError(
        "pass --task for the vanilla pipeline: no artifact among the endpoints says which"
    )


SIMD_FLAGS = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16", "amx_int8"}


def machine() -> dict[str, Any]:
    import os

    import psutil
    import torch

    cpu = "unknown"
    flags: list[str] = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = sorted(set(line.split(":", 1)[1].split()) & SIMD_FLAGS)
    except OSError:
        pass
    return {
        "cpu": cpu,
        # what decides which CPU module format and precision are fastest (bf16 without
        # avx512_bf16 is slower than fp32): results from machines that differ here differ
        "cpu_flags": flags,
        "cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


@dataclass
class Session:
    """What is measured between one server start and its stop (or in process): `make`
    builds the endpoints once the server is up; `endpoints` says how many it will build."""

    label: str
    layout: str
    server: Any
    make: Callable[[], list[Endpoint]]
    endpoints: int = 1

    @property
    def in_process(self) -> bool:
        return self.layout == "in-process"


def _sessions(spec: EndpointSpec, config: BenchConfig) -> Iterator[Session]:
    """The sessions of one endpoint spec: a server bench starts gives one per layout."""
    if spec.type in MANAGED and not _is_url(spec.where):
        for layout in config.layouts:
            yield _managed_session(spec, config, layout)
        return
    where, headers = spec.where, config.headers
    if spec.type == "sagemaker":
        yield Session(
            spec.label,
            "external",
            None,
            lambda: [HttpJsonEndpoint(spec.label, spec.type, where, headers)],
        )
    elif spec.type == "openai":
        yield Session(
            spec.label,
            "external",
            None,
            lambda: [HttpJsonEndpoint(spec.label, "openai", where, headers, field="input")],
        )
    elif spec.type == "runner":
        yield Session(
            spec.label, "in-process", None, lambda: [RunnerEndpoint(spec.label, Path(where))]
        )
    elif spec.type == "vanilla":
        yield Session(
            spec.label,
            "in-process",
            None,
            lambda: [VanillaEndpoint(spec.label, Path(where), _task(config))],
        )
    else:
        raise ValueError(f"{spec.type} needs an artifact directory or an http:// URL")


def _front_session(spec: EndpointSpec, config: BenchConfig, layout: str) -> Session:
    """The front's routes, on one server; /invocations is the session's baseline."""
    label, artifact = f"{spec.label}/{layout}", Path(spec.where)
    server = FrontServer(artifact, layout, config.worker)
    embeds = _task(config) == "feature-extraction"

    def make() -> list[Endpoint]:
        routes: list[Endpoint] = [
            HttpJsonEndpoint(f"{label} /invocations", "front", f"{server.url}/invocations")
        ]
        if embeds:
            routes += [
                HttpJsonEndpoint(f"{label} /embed", "front", f"{server.url}/embed"),
                HttpJsonEndpoint(
                    f"{label} /v1/embeddings", "front", f"{server.url}/v1/embeddings", field="input"
                ),
            ]
        routes[0].baseline = True
        return routes

    return Session(label, layout, server, make, endpoints=3 if embeds else 1)


def _managed_session(spec: EndpointSpec, config: BenchConfig, layout: str) -> Session:
    label, artifact, headers = f"{spec.label}/{layout}", Path(spec.where), config.headers
    if spec.type in FRONTS:
        return _front_session(spec, config, layout)
    front = SageMakerServer(artifact, layout)
    return Session(
        label, layout, front, lambda: [HttpJsonEndpoint(label, "sagemaker", front.url, headers)]
    )


def _points(config: BenchConfig, in_process: bool):
    for seq in config.sequence_lengths:
        for n in config.texts_per_request:
            for c in [1] if in_process else config.concurrency:
                yield seq, n, c


def run_bench(config: BenchConfig, progress: bool = True) -> dict[str, Any]:
    sessions = [s for e in config.endpoints for s in _sessions(e, config)]
    total = sum(s.endpoints * len(list(_points(config, s.in_process))) for s in sessions)
    bar = tqdm(total=total, desc="bench", unit="point", disable=not progress, file=sys.stderr)
    started = datetime.now(timezone.utc)
    sweep = Sweep(config, bar)
    # on a Neuron host: how busy the NeuronCores were at each point
    if sweep.monitor.start():
        bar.write("neuron-monitor: each point records its NeuronCores' utilization")
    try:
        for session in sessions:
            sweep.run_session(session)
    finally:
        sweep.monitor.stop()
    floor = None
    if any("model_gflop" in r for r in sweep.rows):
        # after every server has stopped, so the probe has the machine to itself
        bar.set_postfix_str("probing the machine's peak matrix throughput")
        threads = sorted({r["cores_per_worker"] for r in sweep.rows if "model_gflop" in r})
        floor = {str(t): peak_gops(t) for t in threads}
    bar.close()
    _add_ratios(sweep.rows)
    return {
        "started": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "peak_gops": floor,
        "command": " ".join(sys.argv),
        "config": _config_dict(config),
        "points": sweep.rows,
        "wrk_check": sweep.wrk_check,
    }


class Sweep:
    """Every point of one bench run: the texts of each length, the rows measured so far,
    the wrk cross-check once one HTTP JSON endpoint has been measured."""

    def __init__(self, config: BenchConfig, bar: Any):
        self.config, self.bar = config, bar
        task = _task(config)
        texts: dict[int, str] = {}
        mask = None
        if not task.startswith("image-"):
            tokenizer = _tokenizer_file(config)
            texts = {s: text_with_tokens(tokenizer, s) for s in config.sequence_lengths}
            mask = mask_token(tokenizer) if task == "fill-mask" else None
        self.work = Work(task, texts, mask)
        self.rows: list[dict[str, Any]] = []
        self.use_wrk = config.drives_with_wrk()
        self.monitor = NeuronMonitor()
        self.wrk_check: dict[str, Any] | None = (
            {"skipped": "wrk drove every HTTP point"} if self.use_wrk else None
        )

    def run_session(self, session: Session) -> None:
        """Start the session's server (if any), measure its endpoints, stop it."""
        server = session.server
        measured: dict[int, list[dict[str, Any]]] = {}
        try:  # a start interrupted (Ctrl-C, SIGTERM) stops what it had started
            if server is not None:
                self.bar.set_postfix_str(f"starting {session.label}")
                t0 = time.perf_counter()
                server.start()
                self.bar.write(
                    f"{session.label}: ready in {time.perf_counter() - t0:.0f}s "
                    f"({server.workers} worker(s) x {server.cores_per_worker} core(s))"
                )
            endpoints = session.make()
            if server is not None and self.config.server_warmup_s > 0:
                self.warm_up(endpoints)
            measured.update({id(e): [] for e in endpoints})
            # every endpoint at one point before the next point: the front's routes are
            # measured seconds apart, not minutes, so drift of the machine shows in all
            for seq, n, c in _points(self.config, session.in_process):
                for endpoint in endpoints:
                    row = self.measure(endpoint, session, seq, n, c)
                    measured[id(endpoint)].append(row)
                    self.rows.append(row)
            for endpoint in endpoints:
                if (
                    self.config.wrk
                    and self.wrk_check is None
                    and isinstance(endpoint, HttpJsonEndpoint)
                ):
                    self.wrk_check = self.cross_check(endpoint, measured[id(endpoint)])
                endpoint.close()
        finally:
            if server is not None:
                errors = any(row.get("errors") for rows in measured.values() for row in rows)
                if errors and self.config.logs is not None:
                    into = self.config.logs / session.label.replace("/", "-")
                    if keep_logs(Path(server.tmp.name), into):
                        self.bar.write(f"{session.label}: errors measured; its logs kept in {into}")
                server.stop()

    def cross_check(
        self, endpoint: HttpJsonEndpoint, measured: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Measure one point again with wrk: two load generators that agree on the
        same server say the figures are the server's, not a generator's."""
        from ..load import wrk

        config = self.config
        seq = config.wrk_seq or min(config.sequence_lengths)
        c = max(config.concurrency)
        ours = next(
            (r for r in measured if r["seq"] == seq and r["texts"] == 1 and r["concurrency"] == c),
            None,
        )
        if ours is None or not ours.get("req_per_s"):
            return {"skipped": f"no measured point at seq {seq}, 1 text, concurrency {c}"}
        if not wrk.available():
            return {"skipped": "wrk is not installed (apt-get install wrk)"}
        self.bar.set_postfix_str(f"wrk cross-check {endpoint.label} seq={seq} c={c}")
        try:
            got = wrk.run_wrk(
                endpoint.wrk_request(endpoint.payload(self.work.batch(seq, 1))),
                c,
                max(config.window.duration_s, 5),
            )
        except (RuntimeError, ValueError, OSError) as e:
            return {"skipped": f"wrk failed: {e}"}
        self.bar.write(
            f"wrk cross-check {endpoint.label} seq={seq} c={c}: wrk "
            f"{got['req_per_s']:.1f} req/s, ours {ours['req_per_s']:.1f} req/s"
        )
        return {
            "endpoint": endpoint.label,
            "seq": seq,
            "texts": 1,
            "concurrency": c,
            "wrk": got,
            "ours": {k: ours[k] for k in ("req_per_s", "p50_ms", "p99_ms", "client_cores")},
            "ours_over_wrk": ours["req_per_s"] / got["req_per_s"],
        }

    def warm_up(self, endpoints: list[Endpoint]) -> None:
        """Load a freshly started server at the first point's length and the largest
        concurrency, split over its endpoints, unmeasured."""
        config = self.config
        seq, n, c = config.sequence_lengths[0], config.texts_per_request[0], max(config.concurrency)
        each = config.server_warmup_s / len(endpoints)
        for endpoint in endpoints:
            self.bar.set_postfix_str(f"{endpoint.label}: {each:.0f}s of unmeasured warm-up")
            payload = endpoint.payload(self.work.batch(seq, n))
            run_load(endpoint, payload, c, Window(warmup_s=0.0, duration_s=each, min_requests=1))

    def measure(
        self, endpoint: Endpoint, session: Session, seq: int, n: int, c: int
    ) -> dict[str, Any]:
        """One point of the sweep against one endpoint: `n` texts of `seq` tokens per
        request from `c` clients."""
        server = session.server

        def probe() -> dict[str, Any]:
            if server is None:
                return {"cpu": {}, "t": time.monotonic()}
            return {
                "cpu": cpu_by_role(server.root_pids(), server.front_pid),
                "model_ms": model_ms(server.metrics_url),
                "t": time.monotonic(),
            }

        self.bar.set_postfix_str(f"{endpoint.label} seq={seq} texts={n} c={c}")
        payload = endpoint.payload(self.work.batch(seq, n))
        request = endpoint.wrk_request(payload) if self.use_wrk else None
        row: dict[str, Any] = {
            "endpoint": endpoint.label,
            "type": endpoint.type,
            "session": session.label,
            "baseline": endpoint.baseline,
            "layout": session.layout,
            "seq": seq,
            "texts": n,
            "concurrency": c,
        }
        if request is not None:
            row.update(generator="wrk", **_wrk_point(request, c, self.config.window, probe, n))
        else:
            result = run_load(endpoint, payload, c, self.config.window, probe)
            row.update(generator="python", errors=result.errors, **_summary(result, n))
        row.update(_arithmetic(server, seq, n))
        busy = self.monitor.mean_between(*row.pop("window", (0.0, 0.0)))
        if busy is not None:
            row["neuroncore_busy"] = round(busy, 4)
        if isinstance(endpoint, VanillaEndpoint) and row.get("req_per_s"):
            self.bar.set_postfix_str(f"{endpoint.label} seq={seq}: a plain pipeline() loop")
            window = self.config.window
            plain = endpoint.plain_loop(payload, window.duration_s, window.min_requests)
            row["plain_loop_req_per_s"] = plain
            row["torch_threads"] = torch_threads()
        self.bar.update(1)
        return row


def _wrk_point(
    request: Any, c: int, window: Window, probe: Callable[[], Any], texts: int
) -> dict[str, Any]:
    """One point driven by wrk: warmed up, then measured for the window's duration, with
    the probe around it; the same figures as a point of ours. wrk stops on the clock
    alone, so a window that ends with fewer than `window.min_requests` answers is measured
    again, twice as long each time (all of them together up to `window.max_duration_s`),
    as our own generator would have kept measuring."""
    from ..load import wrk

    if window.warmup_s > 0:
        wrk.run_wrk(request, c, window.warmup_s)
    seconds, spent = window.duration_s, 0.0
    while True:
        start = probe()
        got = wrk.run_wrk(request, c, seconds)
        end = probe()
        # wrk's -d is whole seconds, at least one
        took = max(1, round(seconds))
        spent += took
        done = got["requests"] + got["non_2xx"] + got["socket_errors"]
        if done >= window.min_requests or spent >= window.max_duration_s:
            break
        seconds = min(window.max_duration_s - spent, took * 2)
    out = {k: got[k] for k in ("wall_s", "p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms")}
    out.update(
        requests=got["requests"],
        req_per_s=got["req_per_s"],
        texts_per_s=got["req_per_s"] * texts,
        errors=got["non_2xx"] + got["socket_errors"],
        client_cores=round(got["cpu_s"] / got["wall_s"], 3) if got["wall_s"] else 0.0,
    )
    if got["requests"]:
        out.update(time_split(start, end, got["requests"], got["cpu_s"]))
    if out["errors"]:
        out["error_sample"] = (
            f"{got['non_2xx']} non-2xx answers, {got['socket_errors']} socket errors"
        )
    return out


def _arithmetic(server: Any, seq: int, texts: int) -> dict[str, Any]:
    """What the model behind a server bench started must compute per request (for the
    compute-floor table), the precision it runs and the cores one worker holds."""
    artifact = getattr(server, "artifact", None)
    model = _artifact_model(artifact) if artifact is not None else None
    if model is None:
        return {}
    config, precision = model
    try:
        gflop = encoder_gflop(config, seq, texts)
    except (KeyError, TypeError, ValueError):
        return {}  # not a BERT-shaped encoder config
    cores = server.cores_per_worker
    return {"model_gflop": gflop, "precision": precision, "cores_per_worker": cores}


@functools.cache
def _artifact_model(artifact: Path) -> tuple[dict[str, Any], str] | None:
    """An artifact's model config and precision, read once per process, not per point."""
    if not (artifact / "config.json").is_file():
        return None
    config = json.loads((artifact / "config.json").read_text())
    return config, read_manifest(artifact, verify=False).precision


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _summary(result: LoadResult, texts: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.latencies_ms:
        s = summarize(result.latencies_ms, result.wall_s)
        out.update(
            requests=s.requests,
            wall_s=s.wall_s,
            p50_ms=s.p50_ms,
            p95_ms=s.p95_ms,
            p99_ms=s.p99_ms,
            max_ms=s.max_ms,
            mean_ms=sum(result.latencies_ms) / s.requests,
            req_per_s=s.throughput,
            texts_per_s=s.throughput * texts,
        )
        out.update(
            time_split(result.probe_start, result.probe_end, s.requests, result.client_cpu_s)
        )
    out["client_cores"] = round(result.client_cores, 3)
    if result.error_samples:
        out["error_sample"] = result.error_samples[0]
    return out


def time_split(
    start: dict[str, Any], end: dict[str, Any], requests: int, client_cpu_s: float
) -> dict[str, Any]:
    """The CPU time each process role used per request over the measuring window (a
    server at saturation serves at most cores / CPU-per-request), and the model's time
    per request where the server reports it."""
    out: dict[str, Any] = {"cpu_ms_per_req_client": client_cpu_s * 1e3 / requests}
    if "t" in start and "t" in end:
        out["window"] = (start["t"], end["t"])
    for role, t in end["cpu"].items():
        out[f"cpu_ms_per_req_{role}"] = (t - start["cpu"].get(role, 0.0)) * 1e3 / requests
    if start.get("model_ms") is not None and end.get("model_ms") is not None:
        out["model_ms"] = (end["model_ms"] - start["model_ms"]) / requests
    return out


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """req/s over the vanilla pipeline's at the same sequence length and texts per request,
    measured in the same run; and, in a session with a baseline route, req/s over that
    route's at the same point."""
    base = {(r["seq"], r["texts"]): r.get("req_per_s") for r in rows if r["type"] == "vanilla"}
    baseline = {
        (r["session"], r["seq"], r["texts"], r["concurrency"]): r.get("req_per_s")
        for r in rows
        if r.get("baseline")
    }
    for r in rows:
        b = base.get((r["seq"], r["texts"]))
        if b and r.get("req_per_s"):
            r["ratio_vs_vanilla"] = r["req_per_s"] / b
        e = baseline.get((r.get("session"), r["seq"], r["texts"], r.get("concurrency")))
        if e and r.get("req_per_s") and not r.get("baseline"):
            r["ratio_vs_baseline"] = r["req_per_s"] / e


def _config_dict(config: BenchConfig) -> dict[str, Any]:
    d = asdict(config)
    d["endpoints"] = [f"{e.label}={e.type}:{e.where}" for e in config.endpoints]
    d["tokenizer"] = str(config.tokenizer) if config.tokenizer else None
    d["logs"] = str(config.logs) if config.logs else None
    d["headers"] = sorted(config.headers)  # names only: values may be secrets
    # what the command set for the workers of the servers bench starts
    d["worker"] = (
        config.worker.model_dump(mode="json", exclude_unset=True) if config.worker else None
    )
    return d


def save(results: dict[str, Any], out: Path, title: str = "neuronserve bench") -> list[Path]:
    from .report import write_all

    return write_all(results, Path(out), title)
