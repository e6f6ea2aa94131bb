"""serve triton: start tritonserver on a model repository, return when every model is READY.

The binary comes from a `tritonserver` on PATH (NVIDIA's containers) or from the
nvidia-pytriton wheel. For the wheel, a backend directory of links is assembled (the
Python backend library and utils, plus the stub built for this Python version), and
the environment is set so the stub embeds this environment's Python: its libpython
first on LD_LIBRARY_PATH, its interpreter first on PATH, its packages on PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import requests

from ...cores import DEPLOYMENT_ENV
from ...pids import alive
from ...processes import (
    Background,
    ServeError,
    forget_pid,
    private_dir,
    private_file,
    reap,
    stop_tree,
    terminate,
    thread_states,
    trusted_store,
)
from ...waiting import until
from ...worker import STACKS_SIGNAL
from ..base import NativeRoute
from . import launch
from .section import INSTALL
from .stubs import (
    Count,
    instance_counts,
    kill_orphans,
    live_stubs,
    note_leftovers,
    remove_leftovers,
    stub_regions,
)

PID_FILE = "tritonserver.pid"
# what a start that stalled leaves in the run directory (`wait_ready`)
STALL_REPORT = "stalled-start.txt"
STALLED_LOG = "tritonserver-stalled.log"
# what a start whose tritonserver exited leaves (its whole log), when it is made once more
EXITED_LOG = "tritonserver-exited.log"
# how long the Python backend waits for a stub to start and to initialize its instance
# (Triton's default 30 s): our model.py leases, loads and warms every model there, which
# on a busy host takes longer, and a stub that takes too long fails the whole start (the
# stall check and the start's own timeout bound a real hang)
STUB_TIMEOUT_S = 600
# the healer's files in the run directory (healer.py)
HEALER_PID = "healer.pid"
HEALER_LOG = "healer.log"
HEALER_STATUS_FILE = "instances.json"
# the Python backend's environment folder (one per server, at a fixed /tmp path)
PYTHON_ENVS = "/tmp/python_env_*"
ENDPOINTS_FILE = "endpoints.json"
# how long tritonserver may take to stop (see _command)
EXIT_TIMEOUT_S = 10
LOG_FILE = "tritonserver.log"


@dataclass
class TritonInstance:
    run_dir: Path
    http_url: str
    grpc_url: str
    metrics_url: str
    # each model's instance count, from its config.pbtxt when the server was started
    expected: dict[str, int] = dataclasses.field(default_factory=dict)
    # inference behind the admin key too (behind the front)
    keyed: bool = False

    @property
    def log(self) -> Path:
        return self.run_dir / LOG_FILE

    def headers(self) -> dict[str, str]:
        """What an inference request must carry: the admin key when inference is behind
        it (the front holds it), else nothing."""
        if not self.keyed:
            return {}
        return {ADMIN_HEADER: (self.run_dir / ADMIN_KEY_FILE).read_text().strip()}

    def grpc_headers(self) -> dict[str, str]:
        """`headers()` as gRPC metadata: tritonserver expects a restricted protocol's
        header under the prefix `triton-grpc-protocol-` (measured on 2.51: the bare name
        is refused with "expecting header 'triton-grpc-protocol-...'")."""
        return {GRPC_HEADER_PREFIX + k: v for k, v in self.headers().items()}

    @property
    def pid(self) -> int | None:
        return _pid(self.run_dir)

    def native_routes(self, model: str) -> list[NativeRoute]:
        return [
            NativeRoute("triton-http", self.http_url, model, self.headers()),
            NativeRoute("triton-grpc", self.grpc_url, model, self.grpc_headers()),
        ]

    def out_of_rotation(self, model: str, instance: str) -> bool:
        """Whether Triton no longer hands `instance` of `model` batches from a dead stub:
        the healer took it out, or it runs in a live (replacement) process."""
        try:
            known = self.healing()[model]["instances"]
        except (KeyError, TypeError):
            return False
        if instance not in known:
            return False
        pid = known[instance]
        return pid is None or alive(int(pid))

    def healing(self) -> dict[str, Any]:
        """What the healer last wrote of each model (healer.ModelState); {} before it did."""
        try:
            found = json.loads((self.run_dir / HEALER_STATUS_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def wedged(self) -> dict[str, str]:
        """The models the healer can no longer update (healer.Wedged), with why: only a
        restart makes them whole."""
        return {
            model: str(state.get("last_error", ""))
            for model, state in self.healing().items()
            if isinstance(state, dict) and state.get("state") == "wedged"
        }

    def instances(self) -> dict[str, Count]:
        """Each model's live instances (stub processes) of how many its config asks for;
        while the healer replaces one, those it counted before (the replacement's stub
        is alive while it still loads its models, and serves only once Triton's load
        returns)."""
        counts = instance_counts(self.pid or 0, self.expected)
        for model, state in self.healing().items():
            if model in counts and state.get("state") != "serving":
                alive = min(counts[model].alive, int(state.get("alive", 0)))
                counts[model] = Count(alive, counts[model].expected)
        return counts


def check_numpy() -> None:
    import numpy

    if int(numpy.__version__.split(".")[0]) >= 2:
        raise ServeError(
            f"numpy {numpy.__version__} is installed in the serving environment; Triton's "
            "Python-backend stub misreads tensors with numpy 2 (string tensors crash it, "
            "numeric ones read as zeros). Install numpy<2: pip install 'numpy<2'"
        )


def _pytriton_root() -> Path | None:
    try:
        import pytriton
    except ImportError:
        return None
    return Path(pytriton.__file__).parent / "tritonserver"


def find_tritonserver() -> tuple[Path, Path | None]:
    """(binary, pytriton tritonserver dir or None when a system install is used).

    A `tritonserver` on PATH wins (NVIDIA's containers, with their own backends
    directory); otherwise the one in the nvidia-pytriton wheel.
    """
    import shutil

    found = shutil.which("tritonserver")
    if found:
        return Path(found), None
    root = _pytriton_root()
    if root is not None and (root / "bin" / "tritonserver").is_file():
        return root / "bin" / "tritonserver", root
    raise ServeError(f"no tritonserver found. {INSTALL}")


def backend_directory(root: Path, run_dir: Path) -> Path:
    """Links to the Python backend and this Python's stub, in the layout Triton expects."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServeError(
            f"nvidia-pytriton ships no Python-backend stub for Python {version} (looked for {stub})"
        )
    backends = run_dir / "backends"
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    links = {
        "libtriton_python.so": root / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": root
        / "backends"
        / "python"
        / "triton_python_backend_utils.py",
        "triton_python_backend_stub": stub,
    }
    for name, src in links.items():
        dst = python / name
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        dst.symlink_to(src)
    return backends


def _env(run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    # stubs record the deployment they serve in their core leases (worker.py)
    env[DEPLOYMENT_ENV] = str(run_dir)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH")) if p)
    # The stub finds its packages through the `python3` first on PATH (this environment's,
    # editable installs included) and ignores PYTHONPATH: model.py puts what the caller
    # had on PYTHONPATH back in front of sys.path from this variable.
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env["NEURONSERVE_PYTHONPATH"] = env.get("PYTHONPATH", "")
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    return env


# What no client needs: behind a key ("Restricted APIs" in tritonserver --help:
# --http-restricted-api / --grpc-restricted-protocol). Model control is explicit, so the
# repository API can load and unload: only the healer (healer.py), which reads the key
# from the run directory, and an operator holding it may.
RESTRICTED = "model-repository,model-config,shared-memory,statistics,trace,logging"
ADMIN_HEADER = "neuronserve-admin-key"
# what tritonserver puts before a header name of --grpc-restricted-protocol
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
ADMIN_KEY_FILE = "admin_key"


def admin_key(run_dir: Path) -> str:
    """A fresh key for the restricted APIs of the tritonserver started from `run_dir`,
    kept in a 0600 file there for an operator who needs those APIs."""
    key = secrets.token_urlsafe(32)
    with private_file(Path(run_dir) / ADMIN_KEY_FILE) as f:
        f.write(key + "\n")
    return key


def restricted_api_args(key: str, inference: bool = False) -> list[str]:
    """The restricted-API options; with `inference`, inference behind the key as well
    (behind the front: another local user must not reach the model around its keys)."""
    apis = RESTRICTED + (",inference" if inference else "")
    return [
        f"--http-restricted-api={apis}:{ADMIN_HEADER}={key}",
        f"--grpc-restricted-protocol={apis}:{ADMIN_HEADER}={key}",
    ]


def _server(run_dir: Path) -> Background:
    return Background("tritonserver", Path(run_dir) / PID_FILE, "neuronserve serve triton --stop")


def _pid(run_dir: Path) -> int | None:
    return _server(run_dir).running()


def instance_count(model_dir: Path) -> int:
    from .package import CONFIG, read_config

    config = read_config(Path(model_dir) / CONFIG)
    return sum(max(g.count, 1) for g in config.instance_group) or 1


def models_in(repository: Path) -> list[str]:
    return sorted(p.name for p in Path(repository).iterdir() if (p / "config.pbtxt").is_file())


@dataclass(frozen=True)
class Listen:
    """Where tritonserver listens (loopback by default)."""

    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    address: str = "127.0.0.1"
    # inference behind the admin key as well
    inference_key: bool = False

    def args(self) -> list[str]:
        a = self.address
        out = [
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            f"--http-address={a}",
            f"--grpc-address={a}",
            f"--metrics-address={a}",
        ]
        return out

    def instance(self, run_dir: Path, expected: dict[str, int]) -> TritonInstance:
        a = self.address
        return TritonInstance(
            run_dir,
            f"http://{a}:{self.http_port}",
            f"{a}:{self.grpc_port}",
            f"http://{a}:{self.metrics_port}",
            expected,
            self.inference_key,
        )


def _command(
    found: tuple[Path, Path | None], repository: Path, run_dir: Path, listen: Listen
) -> list[str]:
    """tritonserver's command line; `found` is what find_tritonserver returned."""
    binary, root = found
    models = models_in(repository)
    cmd = [
        str(binary),
        f"--model-repository={repository}",
        *listen.args(),
        *restricted_api_args(admin_key(run_dir), listen.inference_key),
        # explicit: the healer replaces an instance whose stub died (Triton's Python
        # backend never replaces one, and keeps handing it batches)
        "--model-control-mode=explicit",
        *(f"--load-model={m}" for m in models),
        # On SIGTERM Triton waits this long for requests in flight and for its models to
        # unload. An instance the healer replaced after its stub died under load never
        # finishes unloading (every stop after such a kill waited the whole default); an
        # encoder's request takes well under a second, and behind the front
        # requests have drained before the engine is stopped.
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
        "--allow-metrics=true",
        "--allow-cpu-metrics=true",
        "--allow-gpu-metrics=false",
        "--log-info=true",
        f"--backend-config=python,stub-timeout-seconds={STUB_TIMEOUT_S}",
    ]
    if root is not None:
        cmd.append(f"--backend-directory={backend_directory(root, run_dir)}")
    return cmd


def start(  # noqa: PLR0913 - the repository, where to run and listen, and how
    repository: Path,
    run_dir: Path,
    listen: Listen | None = None,
    timeout_s: float = 600,
    log: Callable[[str], object] = print,
    host_shm: bool = False,
) -> TritonInstance:
    """Start tritonserver on `repository` in the background; return once every model in
    it is READY (stopping the server again if that fails). `host_shm`: where no /dev/shm
    of its own can be made, use the host's (a container in which every process runs as
    one user) instead of refusing."""
    repository, run_dir = Path(repository).resolve(), Path(run_dir).resolve()
    listen = listen or Listen()
    if not repository.is_dir() or not models_in(repository):
        raise ServeError(f"{repository} holds no model: run `neuronserve package triton` first")
    _server(run_dir).refuse_second(run_dir)
    trusted_store(repository, "model repository")
    check_numpy()
    # (whether this system can run it at all, glibc included, Engine.start asked first:
    # TritonSection.missing)
    binary, root = find_tritonserver()
    private_dir(run_dir)
    # a server of this run directory that died: its stubs would keep their cores
    _clean_after_crash(run_dir, log)
    compile_model_files(repository)
    cmd = _command((binary, root), repository, run_dir, listen)
    inst = listen.instance(
        run_dir, {m: instance_count(repository / m) for m in models_in(repository)}
    )
    launching = Launching(cmd, host_shm)
    try:
        return _launch(launching, inst, timeout_s, log)
    except StartStalled as e:
        # a hang in Triton's Python backend, not in this deployment: a second start loads
        with contextlib.suppress(FileNotFoundError):
            (run_dir / LOG_FILE).replace(run_dir / STALLED_LOG)
        log(f"warning: {e} (the log kept as {run_dir / STALLED_LOG}); starting it once more")
        return _launch(launching, inst, timeout_s, log)
    except TritonExited as e:
        # a model that cannot load fails the same way again: said at once, with its
        # reason; any other end (a signal, an exit that logged nothing) is kept with its
        # whole log and the start is made once more
        refused = _refused_models(run_dir / LOG_FILE)
        if refused:
            raise ServeError(f"tritonserver could not load {refused}; from {inst.log}") from e
        with contextlib.suppress(FileNotFoundError):
            (run_dir / LOG_FILE).replace(run_dir / EXITED_LOG)
        log(f"warning: {e} (the log kept as {run_dir / EXITED_LOG}); starting it once more")
        return _launch(launching, inst, timeout_s, log)


@dataclass(frozen=True)
class Launching:
    """How tritonserver is executed (launch.py): `cmd` with its admin key, which the
    command line other users read never shows; `host_shm`: the host's /dev/shm where the
    server cannot have one of its own."""

    cmd: list[str]
    host_shm: bool = False

    def spawn(self, server: Background, run_dir: Path) -> subprocess.Popen:
        """tritonserver started through the wrapper, once it runs with its key."""
        key = (run_dir / ADMIN_KEY_FILE).read_text().strip()
        # where /proc hides other users' processes, nobody else reads the command line
        hidden = not launch.proc_hides_processes()
        shown, env = launch.hide(self.cmd, key) if hidden else (self.cmd, {})
        flags = ["--traced"] * hidden + ["--host-shm"] * self.host_shm
        proc = server.spawn(
            [sys.executable, "-m", launch.__name__, *flags, *shown],
            run_dir / LOG_FILE,
            cwd=run_dir,
            env={**_env(run_dir), **env},
        )
        try:
            if hidden:
                launch.hand_over(proc, shown)
            else:
                _wait_exec(proc, shown[0])
        except launch.HandOverFailed as e:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            why = _refused_launch(e.exit_status, run_dir) or f"tritonserver: {e}"
            raise ServeError(why) from None
        refused = _refused_launch(proc.poll(), run_dir)
        if refused:
            raise ServeError(refused)
        return proc


def _refused_launch(status: int | None, run_dir: Path) -> str | None:
    """What the wrapper refused before it executed tritonserver, and what to do."""
    said = _log_errors(run_dir / LOG_FILE)
    if status == launch.NO_PRIVATE_SHM:
        return (
            f"Triton refused: {said}. Its Python backend passes every request through "
            "/dev/shm in regions other local users can open; without a /dev/shm of its own "
            "(CAP_SYS_ADMIN, or unprivileged user namespaces: sysctl "
            "kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0) another user "
            "could read them. Serve with `--engine torchserve`, give the serving user the "
            "capability, or, where every process of this host or container runs as this "
            "user, set `triton.host_shm: true`"
        )
    if status == launch.NO_TRACE:
        return (
            f"Triton refused: {said}. tritonserver takes its admin key on its command line, "
            "which every local user reads in /proc, and this host does not let neuronserve "
            "keep it out of there (ptrace of its own child refused: kernel.yama.ptrace_scope "
            "3, or a seccomp profile). Mount /proc with hidepid=2 and no gid= (that group reads "
            "every command line), allow ptrace of children, "
            "or serve with `--engine torchserve`"
        )
    return None


def _launch(
    launching: Launching, inst: TritonInstance, timeout_s: float, log: Callable[[str], object]
) -> TritonInstance:
    """Start tritonserver and record its pid; wait until its models are READY, then start
    the healer; on any failure stop the server again."""
    run_dir = inst.run_dir
    # a healer's word from an earlier server would stand for this one's instances
    (run_dir / HEALER_STATUS_FILE).unlink(missing_ok=True)
    envs_before = set(glob.glob(PYTHON_ENVS))
    log(f"starting tritonserver {launching.cmd[0]} (run directory {run_dir}) ...")
    server = _server(run_dir)
    proc = launching.spawn(server, run_dir)
    # the identity `--stop` checks is the command line as it stays: tritonserver's, as
    # other users see it (the wrapper executes it in the same process)
    server.record(proc.pid)
    endpoints = {k: v for k, v in dataclasses.asdict(inst).items() if k != "run_dir"}
    (run_dir / ENDPOINTS_FILE).write_text(json.dumps(endpoints))
    try:
        wait_ready(
            inst, list(inst.expected), timeout_s=timeout_s, log=log, gone=lambda: _gone(proc)
        )
        if not launch.private(proc.pid):
            log(
                "warning: tritonserver shares this host's /dev/shm (triton.host_shm: no "
                "namespace of its own could be made): each instance makes its request region "
                "0600 as it starts; see the security guide"
            )
        envs = set(glob.glob(PYTHON_ENVS)) - envs_before
        note_leftovers(run_dir, stub_regions(live_stubs(proc.pid)) | envs)
        _start_healer(run_dir, proc.pid)
        reap(proc)
    except BaseException:
        stop(run_dir, log=lambda *_: None)
        if proc.poll() is None:  # alive, but not the process its pid file names
            stop_tree(proc.pid, proc.terminate, EXIT_TIMEOUT_S + 5)
        raise
    return inst


def _wait_exec(proc: subprocess.Popen, binary: str, timeout_s: float = 30) -> None:
    """Wait until process `proc` runs `binary` (the wrapper has executed it), or has
    exited."""

    def executed() -> bool:
        if proc.poll() is not None:
            return True
        with contextlib.suppress(psutil.Error):
            return psutil.Process(proc.pid).cmdline()[:1] == [binary]
        return False

    until(executed, timeout_s, 0.005)


def compile_model_files(repository: Path) -> None:
    """Byte-compile each model's model.py before tritonserver starts. The stub imports it
    from the repository and would write its __pycache__ there after Triton loaded the
    model (PYTHONDONTWRITEBYTECODE does not reach the stub's embedded Python): a model
    folder changed after its load makes Triton take the healer's next load for a new
    model and load it whole, every instance anew, instead of replacing the dead one alone
    (measured: the new instances then found no free core group, the live ones still
    holding theirs). This process's Python is the one the stub embeds (`_env`)."""
    import py_compile

    for model_py in Path(repository).glob("*/*/model.py"):
        # a folder this process cannot write to, the stub cannot either
        with contextlib.suppress(OSError, py_compile.PyCompileError):
            py_compile.compile(str(model_py), doraise=True)


def _healer(run_dir: Path) -> Background:
    return Background("healer", run_dir / HEALER_PID, "neuronserve serve triton --stop")


def _start_healer(run_dir: Path, server_pid: int, timeout_s: float = 30) -> None:
    """Start the healer and return once it watches (its first status written): a stub
    that dies from then on is replaced, and `instances.json` answers from the start."""
    healer = _healer(run_dir)
    cmd = [sys.executable, "-m", "neuronserve.engines.triton.healer", str(run_dir), str(server_pid)]
    proc = healer.spawn(cmd, run_dir / HEALER_LOG)
    healer.record(proc.pid)
    status = run_dir / HEALER_STATUS_FILE
    until(lambda: status.exists() or proc.poll() is not None, timeout_s)
    if not status.exists():
        raise ServeError(
            f"the healer {'exited' if proc.poll() is not None else 'did not start'} "
            f"before it watched tritonserver: see {run_dir / HEALER_LOG}"
        )
    reap(proc)


# what Triton logs for a model whose load failed ("failed to load 'm' version 1: <why>")
_LOAD_FAILED = re.compile(r"failed to load '([^']+)' version \d+: (.*)")


def _refused_models(log_file: Path) -> str:
    """The models tritonserver's log says could not load, with Triton's reason, except
    those a stub was too slow to start for (load, not the deployment); "" when none."""
    text = log_file.read_text(errors="replace") if log_file.is_file() else ""
    found = {m: why for m, why in _LOAD_FAILED.findall(text) if "Timed out" not in why}
    return "; ".join(f"{m}: {why}" for m, why in found.items())


def _log_errors(path: Path, errors_only: bool = True) -> str:
    """The log's last error lines (its last lines where it has none, or with
    `errors_only` off: what a server stuck loading did last)."""
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    picked = [
        ln for ln in lines if "neuronserve" in ln or ln.startswith("E") or "error" in ln.lower()
    ]
    return "\n  ".join(((errors_only and picked) or lines)[-12:])


def _gone(proc: subprocess.Popen) -> str:
    """How tritonserver (`proc`, our child) ended, for a start that lost it."""
    try:  # a kill is seen a moment after the pid file's process is gone
        code = proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        try:
            name = " ".join(psutil.Process(proc.pid).cmdline()[:1])
        except psutil.Error:
            name = "gone since"
        return f"it runs (pid {proc.pid}) but is not the process recorded in its pid file ({name})"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def wait_ready(  # noqa: PLR0913 - the server, what to wait for, and how
    inst: TritonInstance,
    models: list[str],
    timeout_s: float = 600,
    log=print,
    poll_s: float = 0.5,
    gone: Callable[[], str] | None = None,
) -> None:
    """Return once every model is READY; `gone` says how a server that disappeared
    ended (its exit status or signal), which is kept beside its whole log."""
    last = None
    stalled_since: float | None = None
    states: dict[str, str] = {}

    def ready() -> bool:
        nonlocal last, stalled_since, states
        if inst.pid is None:
            how = gone() if gone is not None else "gone"
            raise TritonExited(
                f"tritonserver exited during start ({how}); the end of {inst.log}:\n  "
                + _log_errors(inst.log, errors_only=False),
                how,
            )
        counts = inst.instances()
        states = {m: _readiness(inst, m, counts[m]) for m in models}
        failed = _failed_loads(inst, [m for m, why in states.items() if why])
        if failed:
            raise ServeError(
                "tritonserver could not load "
                + "; ".join(f"{m}: {reason}" for m, reason in failed.items())
            )
        summary = ", ".join(f"{m}: {'loading' if why else 'READY'}" for m, why in states.items())
        if summary != last:
            log(f"  {summary}")
            last = summary
        if not any(states.values()):
            return True
        stalled_since = _stalled(inst, states, stalled_since)
        if stalled_since is not None and time.monotonic() - stalled_since > STALL_S:
            raise StartStalled(_report_stall(inst))
        return False

    if not until(ready, timeout_s, poll_s):
        waiting = "; ".join(f"{m}: {why}" for m, why in states.items() if why)
        raise ServeError(
            f"models not READY after {timeout_s:.0f}s ({waiting}); the end of {inst.log}:"
            "\n  " + _log_errors(inst.log, errors_only=False)
        )


# Seconds tritonserver may go on not answering once every instance has said it is ready.
# Measured: it answers within a second of the last; 2.51's Python backend was seen (on a
# busy host, about once in a few hundred starts) never to finish a load whose instances
# had all initialized, no progress for ten minutes, nothing logged.
STALL_S = 60
# the line model.py logs when an instance has loaded and warmed up its models
_INSTANCE_READY = re.compile(r"neuronserve: (\S+ pid \d+) .* ready after")


class StartStalled(ServeError):
    """Every instance initialized, and tritonserver still does not answer."""


class TritonExited(ServeError):
    """tritonserver ended (or was lost) during its start; `how`: its exit status, the
    signal that killed it, or why it is not the process recorded."""

    def __init__(self, message: str, how: str):
        super().__init__(message)
        self.how = how


def _stalled(inst: TritonInstance, states: dict[str, str], since: float | None) -> float | None:
    """Since when the start has been stalled (None while it is not): no answer from
    tritonserver although each of its instances has logged that it is ready."""
    if not all("no answer" in why for why in states.values() if why):
        return None
    text = inst.log.read_text(errors="replace") if inst.log.is_file() else ""
    if len(set(_INSTANCE_READY.findall(text))) < sum(inst.expected.values()):
        return None
    return since if since is not None else time.monotonic()


def _report_stall(inst: TritonInstance) -> str:
    """Where the stalled server's processes and threads wait, kept in the run directory;
    each stub prints its Python threads' stacks into the server log (model.py registered
    the signal for it)."""
    pid = inst.pid
    report = thread_states(pid) if pid else "tritonserver is gone"
    for stubs in live_stubs(pid).values() if pid else ():
        for p in stubs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(STACKS_SIGNAL)
    time.sleep(1)  # for the stacks to reach the log
    path = inst.run_dir / STALL_REPORT
    path.write_text(report + "\n")
    return (
        f"tritonserver did not answer {STALL_S}s after every instance said it was ready; "
        f"where its threads wait: {path}; the stubs' Python stacks are in its log"
    )


def _failed_loads(inst: TritonInstance, models: list[str]) -> dict[str, str]:
    """Of `models`, those whose load failed (UNAVAILABLE in Triton's repository index),
    with Triton's reason: waiting longer would not make them ready."""
    if not models:
        return {}
    try:
        key = (inst.run_dir / ADMIN_KEY_FILE).read_text().strip()
        r = requests.post(
            f"{inst.http_url}/v2/repository/index",
            headers={ADMIN_HEADER: key, "Connection": "close"},
            json={},
            timeout=5,
        )
        index = r.json() if r.status_code == 200 else []
    except (requests.RequestException, OSError, ValueError):
        return {}
    return {
        e["name"]: e.get("reason") or "no reason given"
        for e in index
        if isinstance(e, dict) and e.get("name") in models and e.get("state") == "UNAVAILABLE"
    }


def _readiness(inst: TritonInstance, model: str, count: Count) -> str:
    """Why `model` is not ready yet ("" once it is): Triton's answer, or too few stubs
    (Triton says READY before every stub is up)."""
    try:
        # Connection: close, so no idle keep-alive of ours is left for tritonserver to
        # wait on (up to its exit timeout) when it is stopped
        r = requests.get(
            f"{inst.http_url}/v2/models/{model}/ready", timeout=5, headers={"Connection": "close"}
        )
    except requests.RequestException as e:
        return f"no answer from tritonserver ({type(e).__name__})"
    if r.status_code != 200:
        return f"Triton answers {r.status_code}, {count.alive} of {count.expected} stubs alive"
    if not count.whole:
        return f"{count.alive} of {count.expected} stubs alive"
    return ""


def running(run_dir: Path) -> TritonInstance | None:
    run_dir = Path(run_dir).resolve()
    if _pid(run_dir) is None:
        return None
    endpoints = json.loads((run_dir / ENDPOINTS_FILE).read_text())
    return TritonInstance(**{**endpoints, "run_dir": run_dir})


def stop(run_dir: Path, timeout_s: float = 60, log=print) -> bool:
    """Stop the tritonserver started from `run_dir`; wait until it and its stubs are gone."""
    run_dir = Path(run_dir).resolve()
    # the healer first, so it does not take the unloading models for dead ones; Triton
    # unloads its models and stops its stubs itself on SIGTERM
    stubs = _server(run_dir).stop(terminate, timeout_s, log, first=lambda: _stop_healer(run_dir))
    if stubs is None:
        if not _clean_after_crash(run_dir, log):
            log(f"no tritonserver is running from {run_dir}")
        return False
    removed = remove_leftovers(run_dir)
    log(
        f"tritonserver stopped ({stubs} stub process(es) with it"
        + (f"; removed {len(removed)} file(s) its killed processes left)" if removed else ")")
    )
    return True


def _stop_healer(run_dir: Path) -> None:
    _healer(run_dir).stop(terminate, 10, lambda _: None)
    forget_pid(run_dir / HEALER_PID)  # one that had exited leaves its pid file


def _clean_after_crash(run_dir: Path, log: Callable[[str], object]) -> bool:
    """What a tritonserver of `run_dir` that died left running (its healer, its stubs
    holding their core leases) stopped, its files removed; whether there was one."""
    try:
        recorded = int((run_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return False
    _stop_healer(run_dir)
    stubs = kill_orphans(recorded)
    forget_pid(run_dir / PID_FILE)
    remove_leftovers(run_dir)
    log(f"tritonserver (pid {recorded}) had exited; stopped {stubs} stub process(es) it left")
    return True
