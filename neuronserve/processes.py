"""What the launchers need from the OS: private run folders, pid files, a server run in
the background (`Background`: the one start, record, running and stop that TorchServe,
tritonserver and the front each use), process trees, free loopback ports."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from .private_folders import NotPrivate, private_folder
from .waiting import until


class ServeError(RuntimeError):
    """The server could not be started, became unhealthy, or could not be stopped."""


log = logging.getLogger(__name__)


def private_dir(path: Path) -> Path:
    """`path` made (with parents) and set to 0700: logs, keys, settings, pid files,
    catalogs and engine stores go in it, so one that exists must be this user's own, and
    no other user may write any folder above it (private_folders: a folder another local
    user made or can write could hand neuronserve their settings, their models or their
    handler, or a symlink to follow)."""
    try:
        return private_folder(path)
    except NotPrivate as e:
        raise ServeError(
            f"run directory {e}: neuronserve keeps keys, settings, catalogs and pid files "
            "there; remove it, make it this user's own (chmod 700), or choose another"
        ) from None


def private_file(path: Path) -> Any:
    """`path` opened for writing, 0600 and never through a symlink (a log, say)."""
    with contextlib.suppress(FileNotFoundError):
        Path(path).unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    return os.fdopen(fd, "w")


def _identity_file(pid_file: Path) -> Path:
    return Path(pid_file).with_name(Path(pid_file).name + ".identity")


def _started(proc: psutil.Process) -> str:
    """When `proc` started, in the kernel's own clock ticks since boot (/proc/<pid>/stat,
    field 22). psutil's create_time adds the boot time, which this kernel reports rounded
    to the second and which moves when the clock is adjusted: the same process read a
    second apart could look like another one."""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
        return "ticks:" + stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return f"time:{proc.create_time():.0f}"


def record_pid(pid_file: Path, pid: int | None = None) -> None:
    """Write `pid` to `pid_file` (or, with no pid, take the one a server wrote there
    itself) and record beside it who that process is: its start time and command line.
    A pid file outlives its process (a crash, a reboot) and the number is then reused;
    `live_pid` trusts it only while the same process holds it."""
    pid_file = Path(pid_file)
    if pid is None:
        pid = int(pid_file.read_text().strip())
    else:
        with private_file(pid_file) as f:
            f.write(f"{pid}\n")
    proc = psutil.Process(pid)
    # just after exec /proc/<pid>/cmdline can read empty for a moment (seen with
    # tritonserver under load): wait for the command line the process will keep
    cmdline = until(lambda: proc.cmdline() or not proc.is_running(), 5, 0.01)
    if not isinstance(cmdline, list):
        raise ServeError(f"process {pid} shows no command line: cannot record who it is")
    with private_file(_identity_file(pid_file)) as f:
        f.write(json.dumps({"pid": pid, "started": _started(proc), "cmdline": cmdline}))


def forget_pid(pid_file: Path) -> None:
    Path(pid_file).unlink(missing_ok=True)
    _identity_file(pid_file).unlink(missing_ok=True)


def live_pid(pid_file: Path) -> int | None:
    """The pid in `pid_file` if the process `record_pid` recorded still runs: alive (a
    zombie is not), started when it was recorded, with the same command line. A pid that
    merely matches the file (another process reusing the number) is never returned, so
    nothing stops it."""
    try:
        pid = int(Path(pid_file).read_text().strip())
        identity = json.loads(_identity_file(pid_file).read_text())
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        same = (
            identity.get("pid") == pid
            and _started(proc) == identity["started"]
            and proc.cmdline() == identity["cmdline"]
        )
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return None
    if not same:
        log.warning(
            "%s names pid %d, which is now another process (%s): not that server",
            pid_file,
            pid,
            " ".join(proc.cmdline()[:3]),
        )
        return None
    return pid


@dataclass(frozen=True)
class Background:
    """A server run in the background and found again by its pid file: the one way each
    launcher refuses a second start, starts it, records who it is and stops it."""

    what: str  # as messages name it: "TorchServe", "tritonserver", "front"
    pid_file: Path
    stop_command: str  # what a user runs to stop it

    def running(self) -> int | None:
        """Its pid while the process recorded runs (`live_pid`)."""
        return live_pid(self.pid_file)

    def refuse_second(self, run_dir: Path) -> None:
        pid = self.running()
        if pid is not None:
            raise ServeError(
                f"a {self.what} started from {run_dir} is already running (pid {pid}); "
                f"stop it with `{self.stop_command}`"
            )

    def spawn(self, cmd: Sequence[str], log_file: Path, **popen: Any) -> subprocess.Popen:
        """`cmd` started in a session of its own (the caller's Ctrl-C is not the server's;
        a stop reaches its whole group), its output in `log_file`, this user's alone."""
        with private_file(log_file) as out:
            return subprocess.Popen(
                list(cmd), stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **popen
            )

    def record(self, pid: int | None = None) -> None:
        """Who it is, for `running` and `stop` (`record_pid`)."""
        record_pid(self.pid_file, pid)

    def stop(
        self,
        ask: Callable[[int], object],
        timeout_s: float,
        log: Callable[[str], object],
        first: Callable[[], object] | None = None,
    ) -> int | None:
        """Stop it and everything it started: `first` (what must stop before it), then
        `ask` it to stop, wait up to `timeout_s`, kill what is left, forget its pid. The
        number of its other processes that went with it; None when none was running."""
        pid = self.running()
        if pid is None:
            return None
        log(f"stopping {self.what} (pid {pid}) ...")
        if first is not None:
            first()
        others = stop_tree(pid, lambda: ask(pid), timeout_s)
        forget_pid(self.pid_file)
        return others


def reap(proc: subprocess.Popen) -> None:
    """Collect `proc`'s exit status the moment it ends, on a thread of its own. A child
    this process no longer watches would otherwise stay a zombie for as long as this
    process lives, and a zombie passes `kill(pid, 0)`: Triton's stubs, which check their
    server so, would go on holding their cores after it died."""
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()


def terminate(pid: int) -> None:
    """SIGTERM: a server that drains and stops what it started on its own."""
    os.kill(pid, signal.SIGTERM)


def process_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> None:
    """Wait for `procs` to exit; kill what is left after `timeout_s`, then reap."""
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=10)


def stop_tree(pid: int, ask: Callable[[], object], timeout_s: float) -> int:
    """Stop the process `pid` and everything it started: `ask` it to stop (a signal, the
    server's own stop command), wait up to `timeout_s`, kill what is left. Returns how
    many processes the tree held besides `pid`."""
    procs = process_tree(pid)
    ask()
    wait_gone(procs, timeout_s)
    return max(len(procs) - 1, 0)


# Linux's default: source ports of outgoing connections come from 32768-60999
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports free at the moment of asking, below the kernel's
    ephemeral range: a port from that range (what binding port 0 gives) can become the
    source port of any outgoing connection before the server given it binds it (seen:
    tritonserver's metrics port, "already in use", beside busy HTTP clients)."""
    try:
        ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    socks: list[socket.socket] = []
    try:
        for _ in range(1000 if ephemeral - LOWEST_PORT >= 1000 else 0):
            if len(socks) == n:
                break
            port = random.randrange(LOWEST_PORT, ephemeral)
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:  # nothing free below the range: let the kernel choose
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_taken(address: str, port: int) -> str | None:
    """Why `port` on `address` cannot be listened on, naming who holds it when this user
    can see (a front of ours by its run folder, else the process); None when it is free.
    Checked before a server starts, so that a start never takes another server's answer
    for its own."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # as uvicorn binds: a port in TIME_WAIT is free, one with a listener is not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address or "0.0.0.0", port))
            return None
        except OSError as e:
            why = e.strerror or str(e)
    return f"port {port} on {address or '0.0.0.0'} is taken ({why}){_holder(port)}"


def listeners(port: int) -> set[int] | None:
    """The pids listening on `port` that this user can see; None when it cannot tell."""
    try:
        return {
            c.pid
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
        }
    except (psutil.Error, OSError):
        return None


def _holder(port: int) -> str:
    for pid in sorted(listeners(port) or ()):
        try:
            cmdline = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if "neuronserve.serve.front.server" in cmdline:  # a background front: its settings
            run_dir = Path(cmdline[-1]).parent
            return (
                f" by the neuronserve front of run folder {run_dir} (pid {pid}); stop it with "
                f"`neuronserve serve front --stop --run-dir {run_dir}`, or choose another --port"
            )
        return f" by pid {pid} ({' '.join(cmdline)[:120]}); choose another --port"
    return "; choose another --port"
