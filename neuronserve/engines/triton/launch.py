"""tritonserver started so that no other local user reads what it holds: the requests
its Python backend passes through shared memory, and the key of its restricted APIs.

**Shared memory.** The Python backend hands every request to its stub process through a
region in /dev/shm that it creates 0644 (Boost's default, fchmod'ed past any umask); a
local user who opens it in the moment before the stub makes it 0600 keeps reading it.
Started through this module, tritonserver runs in a mount namespace of its own whose
/dev/shm is a fresh 0700 tmpfs: its stubs, which it starts, share it; nothing outside
sees it, and it is gone with the last of them. The namespace needs CAP_SYS_ADMIN (root
on a host, a container given the capability) or, without it, a user namespace of its
own (unprivileged user namespaces, which most distributions allow). Where neither can be
made the wrapper refuses, unless told that /dev/shm is this deployment's alone (`--host-shm`:
a container in which every process runs as one user).

**The admin key.** tritonserver takes that key on its command line only, and every local
user reads every process's command line in /proc/<pid>/cmdline, from the exec on. So the
command line it is executed with carries `--http-restricted-api=hidden` (which
tritonserver refuses to start with) and the real option waits in its environment, which
only its own user can read (proc(5), /proc/pid/environ). The wrapper asks to be traced
(PTRACE_TRACEME) before it executes tritonserver; the kernel stops the new program
before its first instruction, and the launcher, its tracer, points argv[i] at the real
option in the environment block and lets it go (`hand_over`). /proc/<pid>/cmdline shows
the memory between arg_start and arg_end (proc(5)), which still holds the placeholder;
tritonserver's option parser reads argv[i]. If anything fails on the way, tritonserver
parses the placeholder and exits: it never runs with a key someone could read. Where
/proc hides every other user's processes (mounted hidepid=1 or 2, with no gid= whose
group would see them), the key goes on the command line as it is.

    python -m neuronserve.engines.triton.launch [--host-shm] [--traced] PROGRAM [ARG ...]
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

from ...waiting import until

# <sched.h>, <sys/mount.h>, <sys/ptrace.h>
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
PTRACE_TRACEME, PTRACE_CONT, PTRACE_DETACH = 0, 7, 17
SHM = "/dev/shm"
# the wrapper's exit statuses for what it refused, so the launcher can say why
NO_PRIVATE_SHM, NO_TRACE = 70, 71
# where a hidden argument waits in the program's environment, and what its command line
# shows instead: an option value tritonserver refuses, so it never runs with it
HIDDEN_ENV = "NEURONSERVE_HIDDEN_ARG_"
PLACEHOLDER = "hidden"


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    return libc


def _failed(what: str) -> str:
    return f"{what}: {os.strerror(ctypes.get_errno())}"


def own_shm() -> str | None:
    """Give this process a mount namespace with a private tmpfs on /dev/shm (in a user
    namespace of its own where it lacks CAP_SYS_ADMIN); None when done, else why not."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0:
        privileged = _failed("unshare(CLONE_NEWNS)")
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            return f"{privileged}; {_failed('a user namespace (unshare(CLONE_NEWUSER))')}"
        # this user stays itself inside (user_namespaces(7): one line per map, and
        # setgroups denied before an unprivileged process may write gid_map)
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):  # fmt: skip
            Path(f"/proc/self/{name}").write_text(text)
    # first private, so that the mount below never propagates back to the host's /dev/shm
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return _failed("making mounts private")
    flags = MS_NOSUID | MS_NODEV
    if libc.mount(b"neuronserve-shm", SHM.encode(), b"tmpfs", flags, b"mode=0700") != 0:
        return _failed(f"mounting a tmpfs on {SHM}")
    return None


def private(pid: int) -> bool:
    """Whether process `pid` sees a /dev/shm other than this process's."""
    try:
        return os.stat(f"/proc/{pid}/root{SHM}").st_dev != os.stat(SHM).st_dev
    except OSError:
        return False


def proc_hides_processes(mountinfo: str | None = None) -> bool:
    """Whether /proc keeps every other user's processes (their command lines included)
    from this one's: mounted with hidepid=1 or 2 ("noaccess", "invisible"; proc(5)) and
    no `gid=`, whose group sees every process's command line (the documented hardening
    `hidepid=2,gid=proc` lets that group read the key). The last /proc mount is the one
    seen."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return False
    hides = False
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == "/proc" and " - proc " in line:
            options = line.split(" - ", 1)[1].split()[-1].split(",")
            hidden = {f"hidepid={v}" for v in ("1", "2", "noaccess", "invisible")}
            hides = any(o in hidden for o in options) and not any(
                o.startswith("gid=") for o in options
            )
    return hides


def hide(cmd: list[str], secret: str) -> tuple[list[str], dict[str, str]]:
    """`cmd` as its command line will show it, each argument holding `secret` replaced by
    its option's name and PLACEHOLDER, and the environment entries that carry the real
    ones (`hand_over` points the program at them)."""
    shown, env = list(cmd), {}
    for i, arg in enumerate(cmd):
        if secret in arg:
            option = arg.split("=", 1)[0]
            if not option.startswith("--") or secret in option:
                raise ValueError(f"argument {i} holds the secret outside an --option=value")
            shown[i] = f"{option}={PLACEHOLDER}"
            env[f"{HIDDEN_ENV}{i}"] = arg
    return shown, env


class HandOverFailed(RuntimeError):
    """The program could not be given its hidden arguments (it then exits on the
    placeholder); `exit_status` when the wrapper exited before it executed it."""

    def __init__(self, message: str, exit_status: int | None = None):
        super().__init__(message)
        self.exit_status = exit_status


def hand_over(proc: subprocess.Popen, shown: list[str], timeout_s: float = 60) -> None:
    """In the tracer (the wrapper's parent): wait until `proc` has executed `shown[0]`
    and stopped, point each hidden argument at its environment entry, let it run."""
    pid, deadline = proc.pid, time.monotonic() + timeout_s
    libc = _libc()
    while True:
        changed = until(lambda: _changed(pid), max(0.0, deadline - time.monotonic()), 0.002)
        if changed is None:
            proc.kill()
            raise HandOverFailed(f"{shown[0]} was not executed within {timeout_s:.0f}s")
        status = changed[0]
        if not os.WIFSTOPPED(status):  # the wrapper ended: its status is proc's
            proc.returncode = os.waitstatus_to_exitcode(status)
            raise HandOverFailed(f"exited before {shown[0]} ran", proc.returncode)
        sig = os.WSTOPSIG(status)
        if sig == signal.SIGTRAP and _cmdline(pid) == shown:
            break
        # a signal for the wrapper before its exec: delivered as it was sent
        libc.ptrace(PTRACE_CONT, pid, None, ctypes.c_void_p(0 if sig == signal.SIGTRAP else sig))
    try:
        _point_at_environment(pid, shown)
    finally:  # whatever happened: run, and exit on the placeholder if not handed over
        if libc.ptrace(PTRACE_DETACH, pid, None, None) != 0:
            proc.kill()


def _changed(pid: int) -> tuple[int] | None:
    """The status of `pid` once it has stopped or ended (a tuple: an exit status may be 0)."""
    waited, status = os.waitpid(pid, os.WNOHANG)
    return (status,) if waited else None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def _point_at_environment(pid: int, shown: list[str]) -> None:
    """At the stop after exec, where the kernel laid out the new program's stack
    (mm->start_stack, /proc/<pid>/stat field 28): argc, then argv's pointers; argv[0]
    points at arg_start (field 48), the environment's strings lie between env_start and
    env_end (fields 50, 51). Every pointer is checked before one is changed."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # proc(5) numbers fields from 1; this list starts at field 3 (the state)
    stack, arg_start, env_start, env_end = (int(fields[n - 3]) for n in (28, 48, 50, 51))
    width = struct.calcsize("P")
    word = "<Q" if width == 8 else "<I"
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
        mem.seek(stack)
        argc = struct.unpack(word, mem.read(width))[0]
        argv = [struct.unpack(word, mem.read(width))[0] for _ in range(argc)]
        if argc != len(shown) or not argv or argv[0] != arg_start:
            raise HandOverFailed(f"pid {pid}'s stack is not laid out as execve(2) says")
        mem.seek(env_start)
        block = mem.read(env_end - env_start)
        entries, offset = {}, 0
        for entry in block.split(b"\0"):
            name = entry.split(b"=", 1)[0].decode(errors="replace")
            entries[name] = env_start + offset + len(name) + 1
            offset += len(entry) + 1
        for i in range(argc):
            name = f"{HIDDEN_ENV}{i}"
            if name in entries:
                mem.seek(stack + width * (1 + i))
                mem.write(struct.pack(word, entries[name]))


def main(argv: list[str]) -> None:
    flags, program = set(), list(argv)
    while program and program[0] in ("--host-shm", "--traced"):
        flags.add(program.pop(0))
    if not program:
        print(f"usage: python -m {__name__} [--host-shm] [--traced] PROGRAM [ARG ...]",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    why = own_shm()
    if why is not None and "--host-shm" not in flags:
        print(f"neuronserve: no /dev/shm of its own for {program[0]}: {why}", file=sys.stderr)
        sys.exit(NO_PRIVATE_SHM)
    if "--traced" in flags and _libc().ptrace(PTRACE_TRACEME, 0, None, None) != 0:
        code = ctypes.get_errno()
        print(f"neuronserve: ptrace(PTRACE_TRACEME): {os.strerror(code)}", file=sys.stderr)
        sys.exit(NO_TRACE if code in (errno.EPERM, errno.EACCES, errno.ENOSYS) else 1)
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
    os.execv(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
