"""serve torchserve: start TorchServe on a model store, return when every worker is READY.

TorchServe's `/ping` answers Healthy before workers have loaded anything, so readiness
is read from the management API, worker by worker. A worker that cannot start (no free
core group, broken artifact) logs a `neuronserve:` line that is reported here instead
of waiting for a worker that will never come.

All of TorchServe's files (pid file, key file, logs, unpacked models) live in a run
directory of our own, so `--stop` finds the server it started and nothing lands in a
bare /tmp or the caller's working directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import requests

from ...cores import DEPLOYMENT_ENV
from ...pids import alive
from ...processes import (
    Background,
    ServeError,
    private_dir,
    private_file,
    trusted_store,
)
from ...resources import package_file, tool
from ...waiting import until
from ...worker import FAILURE_MARKER
from ..base import NativeRoute
from .package import CONFIG_FILE, read_properties, write_properties

# TorchServe's log configuration (log4j2.xml beside this module says how it differs from
# TorchServe's own)
LOG_CONFIG = "log4j2.xml"

if TYPE_CHECKING:
    from .section import TorchServeSection

__all__ = [
    "ServeError",
    "TorchServeInstance",
    "running",
    "server_pid",
    "start",
    "stop",
    "wait_ready",
    "worker_counts",
    "worker_failures",
]


@dataclass
class TorchServeInstance:
    run_dir: Path
    inference_url: str
    management_url: str
    metrics_url: str
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return server_pid(self.run_dir)

    def native_routes(self, model: str) -> list[NativeRoute]:
        return [
            NativeRoute("torchserve", f"{self.inference_url}/predictions", model, self.headers())
        ]

    def headers(self, api: str = "inference") -> dict[str, str]:
        key = self.keys.get(api)
        return {"Authorization": f"Bearer {key}"} if key else {}

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    def model_status(self, name: str) -> list[dict]:
        r = requests.get(
            f"{self.management_url}/models/{name}", headers=self.headers("management"), timeout=10
        )
        r.raise_for_status()
        return r.json()

    def workers(self, name: str) -> list[dict]:
        return [w for entry in self.model_status(name) for w in entry.get("workers", [])]


# the longest path of a Unix socket (sun_path: 108 bytes with its NUL)
SOCKET_PATH_MAX = 107


def _tmp(run_dir: Path) -> Path:
    """TorchServe's temporary folder: its pid file, and the Unix sockets of its workers
    (`.ts.sock.<port>`). Under a run folder deep enough that a socket's path would pass
    the kernel's limit (every worker would fail with "AF_UNIX path too long", and the
    start wait for ever), a short one of this user's named after the run folder, so that
    `--stop` finds it too: in $XDG_RUNTIME_DIR (this user's alone), else the temp folder."""
    inside = run_dir / "tmp"
    if len(str(inside / ".ts.sock.65535").encode()) <= SOCKET_PATH_MAX:
        return inside
    import hashlib
    import tempfile

    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
    return Path(base) / f"neuronserve-ts-{os.getuid()}-{digest}"


def _env(run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            # TorchServe puts its pid file in $TMPDIR: `--stop` must see the same one.
            "TMPDIR": str(_tmp(run_dir)),
            "LOG_LOCATION": str(run_dir / "logs"),
            "METRICS_LOCATION": str(run_dir / "logs"),
            # Workers pin themselves and size their own pools after leasing cores; until
            # then nothing should spread threads across every core.
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            # workers record which deployment they serve in their core leases, so a worker
            # that finds every core taken can say whose workers hold them
            DEPLOYMENT_ENV: str(run_dir),
        }
    )
    return env


def _pid_file(run_dir: Path) -> Path:
    return _tmp(run_dir) / ".model_server.pid"


def _server(run_dir: Path) -> Background:
    return Background("TorchServe", _pid_file(run_dir), "neuronserve serve torchserve --stop")


def _record_pid(run_dir: Path) -> None:
    """TorchServe writes its pid; who that process is, neuronserve records (`--stop`)."""
    try:
        _server(run_dir).record()
    except (OSError, ValueError, psutil.Error) as e:
        raise ServeError(f"TorchServe started but its pid file cannot be read: {e}") from None


def server_pid(run_dir: Path) -> int | None:
    return _server(run_dir).running()


def _instance(run_dir: Path, props: dict[str, str]) -> TorchServeInstance:
    keys = {}
    key_file = run_dir / "key_file.json"
    if key_file.is_file():
        data = json.loads(key_file.read_text())
        keys = {api: data[api]["key"] for api in ("inference", "management", "API") if api in data}
    return TorchServeInstance(
        run_dir=run_dir,
        inference_url=props["inference_address"],
        management_url=props["management_address"],
        metrics_url=props["metrics_address"],
        keys=keys,
    )


def start(
    model_store: Path,
    run_dir: Path,
    overrides: dict[str, str] | None = None,
    timeout_s: float = 600,
    log=print,
) -> TorchServeInstance:
    """Start TorchServe on `model_store` and wait until every worker of every model is READY."""
    model_store, run_dir = Path(model_store).resolve(), Path(run_dir).resolve()
    store_config = model_store / CONFIG_FILE
    if not store_config.is_file():
        raise ServeError(
            f"{store_config} is missing: run `neuronserve package torchserve` "
            "into this model store first"
        )
    _server(run_dir).refuse_second(run_dir)
    trusted_store(model_store, "model store")
    # TorchServe's own logs and key file land here: this user's alone
    private_dir(run_dir)
    for folder in (_tmp(run_dir), run_dir / "logs"):
        private_dir(folder)
    for old in (run_dir / "logs").glob("*.log"):
        old.unlink()
    props = read_properties(store_config)
    props.update(overrides or {})
    props["model_store"] = str(model_store)
    if "metrics_config" in props and not Path(props["metrics_config"]).is_absolute():
        props["metrics_config"] = str(model_store / props["metrics_config"])
    props["vmargs"] = f"-Djava.io.tmpdir={_tmp(run_dir)}"
    config = run_dir / CONFIG_FILE
    write_properties(config, props)

    log(f"starting TorchServe (run directory {run_dir}) ...")
    with private_file(run_dir / "logs" / "launcher.log") as out:
        proc = subprocess.run(
            _command(model_store, config),
            cwd=run_dir,
            env=_env(run_dir),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=120,
        )
    if proc.returncode != 0:
        raise ServeError(f"torchserve --start failed; see {run_dir / 'logs' / 'launcher.log'}")
    _record_pid(run_dir)
    instance = _instance(run_dir, props)
    try:
        wait_ready(instance, timeout_s=timeout_s, log=log)
    except BaseException:
        stop(run_dir, log=lambda *_: None)
        raise
    return instance


def _command(model_store: Path, config: Path) -> list[str]:
    """`torchserve --start` on the store, with the run's config.properties and our
    log4j2.xml (the file says how it differs from TorchServe's)."""
    return [
        *tool("torchserve", "ts.model_server", "start"),
        "--start",
        "--ncs",
        "--model-store",
        str(model_store),
        "--ts-config",
        str(config),
        "--log-config",
        str(package_file(__package__ or __name__, LOG_CONFIG)),
    ]


def worker_counts(instance: TorchServeInstance, name: str) -> tuple[int, int, list[str]]:
    """(ready, expected, statuses) for one model."""
    return worker_counts_of(instance.model_status(name))


def worker_counts_of(entries: list[dict]) -> tuple[int, int, list[str]]:
    """(ready, expected, statuses) from a model's management API answer. A worker counts
    as ready while it is READY and its process runs: one killed a moment ago is still
    listed READY until the frontend notices."""
    workers, expected = [], 1
    for entry in entries:
        workers.extend(entry.get("workers", []))
        expected = max(expected, int(entry.get("minWorkers", 1)))
    statuses = [w.get("status", "?") for w in workers]
    ready = sum(
        s == "READY" and alive(w.get("pid")) for s, w in zip(statuses, workers, strict=True)
    )
    return ready, expected, statuses


def worker_failures(log_dir: Path) -> list[str]:
    """Lines in the model log where a worker reported it could not start, or where
    TorchServe's worker process failed before it reached our handler (its socket)."""
    lines = []
    path = log_dir / "model_log.log"
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            if FAILURE_MARKER in line:
                lines.append(line.split(FAILURE_MARKER)[-1].strip())
            elif "AF_UNIX path too long" in line:
                lines.append(
                    "TorchServe's worker socket path is too long: use a shorter run folder"
                )
    return lines


def wait_ready(
    instance: TorchServeInstance, timeout_s: float = 600, log=print, poll_s: float = 0.5
) -> None:
    """Poll the management API until every worker of every model is READY."""
    started = time.monotonic()
    last = None

    def ready() -> bool:
        nonlocal last
        # The pid file appears a moment after `torchserve --start` returns.
        if not server_pid(instance.run_dir) and time.monotonic() - started > 10:
            raise ServeError(f"TorchServe exited during start; see {instance.log_dir}")
        try:
            if not instance.keys:
                instance.keys = _instance(
                    instance.run_dir,
                    {
                        "inference_address": instance.inference_url,
                        "management_address": instance.management_url,
                        "metrics_address": instance.metrics_url,
                    },
                ).keys
            r = requests.get(
                f"{instance.management_url}/models",
                headers=instance.headers("management"),
                timeout=5,
            )
            r.raise_for_status()
            names = [m["modelName"] for m in r.json().get("models", [])]
            state = {n: worker_counts(instance, n) for n in names}
        except (requests.RequestException, ValueError, KeyError):
            state = None
        if state:
            summary = ", ".join(
                f"{n}: {ready}/{want} workers ready" for n, (ready, want, _) in state.items()
            )
            if summary != last:
                log(f"  {summary}")
                last = summary
            if all(ready >= want for ready, want, _ in state.values()):
                return True
        failures = worker_failures(instance.log_dir)
        if failures:
            raise ServeError("a worker failed to start:\n  " + "\n  ".join(sorted(set(failures))))
        return False

    if not until(ready, timeout_s, poll_s):
        raise ServeError(f"workers not READY after {timeout_s:.0f}s; see {instance.log_dir}")


def running(run_dir: Path) -> TorchServeInstance | None:
    run_dir = Path(run_dir).resolve()
    if not server_pid(run_dir):
        return None
    return _instance(run_dir, read_properties(run_dir / CONFIG_FILE))


def stop(run_dir: Path, timeout_s: float = 60, log=print) -> bool:
    """Stop the TorchServe started from `run_dir` and wait until its processes are gone."""
    run_dir = Path(run_dir).resolve()

    def ask(_pid: int) -> object:
        # `torchserve --stop` returns before the JVM has exited, and may leave workers
        # behind: the tree is waited for, and what is left killed
        return subprocess.run(
            [*tool("torchserve", "ts.model_server", "start"), "--stop"],
            cwd=run_dir,
            env=_env(run_dir),
            capture_output=True,
            timeout=60,
        )

    workers = _server(run_dir).stop(ask, timeout_s, log)
    if workers is None:
        log(f"no TorchServe is running from {run_dir}")
        return False
    log(f"TorchServe stopped ({workers} worker process(es) with it)")
    return True


def models_in(store: Path) -> list[str]:
    """The models TorchServe loads from `store` (load_models=all): each .mar, and each
    folder an archive was unpacked into (--archive-format no-archive)."""
    store = Path(store)
    if not store.is_dir():
        return []
    return sorted(
        p.stem if p.suffix == ".mar" else p.name
        for p in store.iterdir()
        if (p.suffix == ".mar" and p.is_file()) or (p / "MAR-INF" / "MANIFEST.json").is_file()
    )


def listen_overrides(section: TorchServeSection) -> dict[str, str]:
    """config.properties entries for what the section gives of where TorchServe listens,
    over what packaging wrote into the store (an address given replaces the three HTTP
    addresses, on the section's ports)."""
    given = section.model_fields_set
    a = section.bind_address
    out = {}
    if given & {"bind_address", "inference_port", "management_port", "metrics_port"}:
        out = {
            "inference_address": f"http://{a}:{section.inference_port}",
            "management_address": f"http://{a}:{section.management_port}",
            "metrics_address": f"http://{a}:{section.metrics_port}",
        }
    for port in ("grpc_inference_port", "grpc_management_port"):
        if port in given:
            out[port] = str(getattr(section, port))
    return out
