"""tritonserver with a /dev/shm of its own, so no other local user can read requests there.

Triton's Python backend hands every request to its stub process through a shared-memory
region (`/dev/shm/triton_python_backend_shm_region_*`) that it creates with Boost's
default permissions and then fchmods to them (0644, whatever the umask): any local user
can open it and read the texts sent to the model. Started through this module,
tritonserver runs in a mount namespace of its own whose /dev/shm is a fresh tmpfs (mode
0700): its stubs, which it starts, share it; nothing outside sees it, and it is gone with
the last of them (no regions left behind by a crash).

    python -m neuronserve.engines.triton.shm PROGRAM [ARG ...]

makes the namespace if this process may (CAP_SYS_ADMIN: root outside a container, or a
container given the capability) and executes PROGRAM either way, in the same process.
Where it may not, the launcher says so (`private(pid)`), and each stub makes its own
region 0600 as it starts (worker.make_shared_memory_private), before any request
reaches it.
"""

from __future__ import annotations

import ctypes
import os
import sys

# <sched.h>, <sys/mount.h>
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
SHM = "/dev/shm"


def own_shm() -> str | None:
    """Give this process a mount namespace with a private tmpfs on /dev/shm; None when
    done, else why not (nothing is changed then)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def failed(what: str) -> str:
        return f"{what}: {os.strerror(ctypes.get_errno())}"

    if libc.unshare(CLONE_NEWNS) != 0:
        return failed("unshare(CLONE_NEWNS)")
    # first private, so that the mount below never propagates back to the host's /dev/shm
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return failed("making mounts private")
    flags = MS_NOSUID | MS_NODEV
    if libc.mount(b"neuronserve-shm", SHM.encode(), b"tmpfs", flags, b"mode=0700") != 0:
        return failed(f"mounting a tmpfs on {SHM}")
    return None


def private(pid: int) -> bool:
    """Whether process `pid` sees a /dev/shm other than this process's."""
    try:
        return os.stat(f"/proc/{pid}/root{SHM}").st_dev != os.stat(SHM).st_dev
    except OSError:
        return False


def main(argv: list[str]) -> None:
    if not argv:
        print("usage: python -m neuronserve.engines.triton.shm PROGRAM [ARG ...]", file=sys.stderr)
        sys.exit(2)
    own_shm()  # where it cannot, the launcher finds out from `private(pid)`
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
