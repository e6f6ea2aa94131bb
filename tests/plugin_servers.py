"""tritonserver and TorchServe started as their own users start them, on what
`neuronserve package triton` and `neuronserve package torchserve` wrote: no neuronserve
process, wrapper or variable (the tests' lease folder aside, which keeps this test run's
cores apart from its siblings': `NEURONSERVE_LEASE_DIR`, a host setting).

tritonserver is the nvidia-pytriton wheel's, set up as that wheel sets itself up
(pytriton/triton.py, `_prepare_triton_inference_server`, and its server's `_get_env`):
its server folder copied without the per-Python stubs, the stub of this Python put in
the Python backend's folder, the wheel's libraries and this Python's libpython on
LD_LIBRARY_PATH and this environment's interpreter first on PATH (the stub embeds the
`python3` it finds there). Then `tritonserver --model-repository REPO
--backend-directory <that folder>/backends`, as Triton's docs start it, with a /dev/shm
of its own as a container has (OWN_SHM). TorchServe:
`torchserve --start --model-store STORE --ts-config STORE/config.properties`, as its
docs start it, and `torchserve --stop`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests
from helpers import free_port, wait_for

from neuronserve.processes import process_tree, wait_gone


def pytriton_dir() -> Path:
    import pytriton

    return Path(pytriton.__file__).parent


def triton_folder(out: Path) -> Path:
    """The wheel's server folder, with this Python's stub in the Python backend."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    dist = pytriton_dir() / "tritonserver"
    shutil.copytree(dist, out, ignore=shutil.ignore_patterns("python_backend_stubs"))
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    shutil.copy(stub, out / "backends" / "python" / "triton_python_backend_stub")
    return out


def triton_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    libs = [
        sysconfig.get_config_var("LIBDIR") or "",
        str(pytriton_dir().parent / "nvidia_pytriton.libs"),
    ]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    # the stub ignores PYTHONPATH; neuronserve's model.py puts this variable's folders in
    # front of sys.path (the Neuron SDK stand-in's, in the tests that use it)
    env["NEURONSERVE_PYTHONPATH"] = env.get("PYTHONPATH", "")
    return env


# tritonserver's Python backend hands requests to its stubs through regions in /dev/shm:
# it runs with a /dev/shm of its own, as in a container (NVIDIA's, SageMaker's, a pod),
# so that nothing it leaves (a killed stub's region) is in the host's, where other tests
# watch that none appears (tests/servers/test_security_processes.py)
OWN_SHM = [
    "unshare", "--mount", "--propagation", "private",
    *([] if os.geteuid() == 0 else ["--map-root-user"]),
    "sh", "-c", 'mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm && exec "$0" "$@"',
]  # fmt: skip


@dataclass
class Server:
    process: subprocess.Popen | None
    url: str
    log: Path
    headers: dict[str, str]
    pid: int
    # tritonserver's other endpoints
    grpc_url: str = ""
    metrics_url: str = ""

    def children(self) -> list[psutil.Process]:
        return psutil.Process(self.pid).children(recursive=True)

    def running(self, marker: str) -> list[psutil.Process]:
        """Its live processes whose command line holds `marker` (a killed one is a zombie
        until its parent reaps it: not counted)."""
        found = []
        for p in self.children():
            try:
                if p.status() != psutil.STATUS_ZOMBIE and marker in " ".join(p.cmdline()):
                    found.append(p)
            except psutil.Error:
                continue
        return found


def start_tritonserver(repo: Path, work: Path, env: dict[str, str] | None = None) -> Server:
    folder = triton_folder(work / "tritonserver")
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = work / "tritonserver.log"
    cmd = [
        *OWN_SHM,
        str(folder / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={folder / 'backends'}",
        "--http-address=127.0.0.1",
        f"--http-port={http}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics}",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=triton_env(env))
    url = f"http://127.0.0.1:{http}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"tritonserver exited ({proc.returncode}):\n{log.read_text()}")
        try:
            return requests.get(f"{url}/v2/health/ready", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_for(ready, 180, what="tritonserver ready")
    except BaseException:
        # a server that never came up must not outlive its test: its stubs hold their core
        # leases, and every later server of this test process would find none free
        wait_gone(process_tree(proc.pid), 0)  # killed now, then reaped
        raise
    return Server(proc, url, log, {}, proc.pid, f"127.0.0.1:{grpc}", f"http://127.0.0.1:{metrics}")


def stop_tritonserver(server: Server, within_s: float = 60) -> int:
    """SIGTERM, as a container runtime stops it; its exit status once it and its stubs
    are gone."""
    stubs = server.children()
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    status = server.process.wait(within_s)
    wait_for(lambda: not [p for p in stubs if _alive(p)], 30, what="the stubs gone")
    return status


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _torchserve(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "torchserve"), *args]


def _torchserve_env(work: Path, env: dict[str, str] | None) -> dict[str, str]:
    return {**(os.environ if env is None else env), "TEMP": str(work / "tmp"),
            "TMPDIR": str(work / "tmp")}  # fmt: skip


def _torchserve_keys(work: Path, props: dict[str, str]) -> tuple[dict, dict]:
    """The inference and management headers, once TorchServe has written its keys (none
    where the store's config turns token authorization off)."""
    if props.get("disable_token_authorization") == "true":
        return {}, {}
    keys = work / "key_file.json"

    def written() -> bool:
        try:
            return "inference" in json.loads(keys.read_text())
        except (OSError, ValueError):
            return False

    wait_for(written, 120, what="TorchServe's key file")
    tokens = json.loads(keys.read_text())
    return (
        {"Authorization": f"Bearer {tokens['inference']['key']}"},
        {"Authorization": f"Bearer {tokens['management']['key']}"},
    )


def start_torchserve(store: Path, work: Path, env: dict[str, str] | None = None) -> Server:
    """`torchserve --start` from `work` (where it writes key_file.json and its logs), the
    store's own config; ready once every worker of every model is READY (`env`: its
    environment, default this process's)."""
    work.mkdir(parents=True, exist_ok=True)
    given = env
    env = _torchserve_env(work, env)
    (work / "tmp").mkdir(exist_ok=True)
    cmd = _torchserve(
        "--start", "--model-store", str(store), "--ts-config", str(store / "config.properties")
    )  # fmt: skip
    log = work / "logs" / "ts_log.log"
    # the launcher's output to a file: the JVM it starts keeps a pipe open as long as it runs
    with (work / "torchserve-start.log").open("w") as out:
        subprocess.run(cmd, cwd=work, env=env, check=True, stdout=out, stderr=out, timeout=120)
    pid_file = work / "tmp" / ".model_server.pid"
    wait_for(pid_file.is_file, 60, what="TorchServe's pid file")
    pid = int(pid_file.read_text().strip())
    props = dict(
        line.split("=", 1) for line in (store / "config.properties").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )  # fmt: skip
    url, management = props["inference_address"], props["management_address"]
    inference, manage = _torchserve_keys(work, props)

    def ready() -> bool:
        if not psutil.pid_exists(pid):
            raise AssertionError(f"torchserve exited:\n{log.read_text() if log.exists() else ''}")
        try:
            models = requests.get(f"{management}/models", headers=manage, timeout=2).json()
            names = [m["modelName"] for m in models.get("models", [])]
            if not names:
                return False
            for name in names:
                [described] = requests.get(
                    f"{management}/models/{name}", headers=manage, timeout=2
                ).json()
                workers = described.get("workers", [])
                if not workers or any(w["status"] != "READY" for w in workers):
                    return False
            return True
        except (requests.ConnectionError, ValueError, KeyError):
            return False

    server = Server(None, url, log, inference, pid)
    try:
        wait_for(ready, 240, what="every TorchServe worker READY")
    except BaseException:
        stop_torchserve(server, work, given)  # a start that failed leaves no JVM behind
        raise
    server.management, server.manage_headers = management, manage  # type: ignore[attr-defined]
    return server


def stop_torchserve(server: Server, work: Path, env: dict[str, str] | None = None) -> int:
    """`torchserve --stop`, then until the frontend and every worker are gone."""
    frontend = psutil.Process(server.pid)
    workers = server.children()
    env = _torchserve_env(work, env)
    with (work / "torchserve-stop.log").open("w") as out:
        subprocess.run(_torchserve("--stop"), cwd=work, env=env, check=True, stdout=out, stderr=out)
    # `torchserve --stop` returns before the JVM is gone (ENVIRONMENT.md): wait for it
    gone = [frontend, *workers]
    wait_for(lambda: not [p for p in gone if _alive(p)], 60, what="TorchServe gone")
    return 0


def affinity(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no affinity for {pid}")
