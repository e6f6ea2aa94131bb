"""Cores are leased, not guessed.

Discovery finds the cores this process may use; a plan splits them into groups of
`cores_per_worker`; a worker claims a group with one advisory file lock per core
(the kernel drops the locks when the process dies, so a restarted worker finds its
predecessor's group free) and pins itself before any runtime initialises.

Servers give workers no usable index (TorchServe none at all on CPU/Neuron, Triton an
instance name), so a lease is the only way two live workers never share a core.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

LEASE_DIR_ENV = "NEURONSERVE_LEASE_DIR"
CORES_ENV = "NEURONSERVE_CORES"  # restrict discovery, e.g. "0-3" or "0,2"
NEURON_CORES_ENV = "NEURONSERVE_NEURON_CORES"  # how many NeuronCores the host has
NEURON_SDK_MODULES = ("torch_neuronx", "torch_neuron")
# NeuronCores per Neuron device, by instance family (for counting /dev/neuron*)
CORES_PER_DEVICE = {"inf1": 4, "inf2": 2, "trn1": 2, "trn1n": 2, "trn2": 8}


class NoFreeCoreGroup(RuntimeError):
    """Every core group of the plan is leased by a live worker."""


@dataclass(frozen=True)
class CoreGroup:
    index: int
    cores: tuple[int, ...]

    @property
    def label(self) -> str:
        """`a` or `a-b` for contiguous groups, else a comma list (NEURON_RT_VISIBLE_CORES form)."""
        c = self.cores
        if len(c) == 1:
            return str(c[0])
        if list(c) == list(range(c[0], c[-1] + 1)):
            return f"{c[0]}-{c[-1]}"
        return ",".join(map(str, c))


def parse_core_list(text: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]"""
    cores: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cores.update(range(int(lo), int(hi) + 1))
        else:
            cores.add(int(part))
    return sorted(cores)


def discover_cpu_cores() -> list[int]:
    """CPU cores from this process's affinity, narrowed by NEURONSERVE_CORES if set."""
    allowed = sorted(os.sched_getaffinity(0))
    restrict = os.environ.get(CORES_ENV)
    if restrict:
        wanted = parse_core_list(restrict)
        missing = sorted(set(wanted) - set(allowed))
        if missing:
            raise NoFreeCoreGroup(
                f"{CORES_ENV}={restrict} names cores {missing} outside this process's "
                f"affinity {allowed}"
            )
        return wanted
    return allowed


def _instance_family() -> str | None:
    try:
        name = Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip()
    except OSError:
        return None
    return name.split(".")[0] if name else None


def discover_neuron_cores(override: int | None = None) -> list[int]:
    """NeuronCore indices of this host.

    In order: an explicit count (spec `neuron_cores`), NEURONSERVE_NEURON_CORES,
    `neuron-ls --json-output`, then /dev/neuron* devices times the cores per device of
    the instance family.
    """
    if override:
        return list(range(int(override)))
    env = os.environ.get(NEURON_CORES_ENV)
    if env:
        return list(range(int(env)))
    import shutil
    import subprocess

    if shutil.which("neuron-ls"):
        try:
            out = subprocess.run(
                ["neuron-ls", "--json-output"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            devices = json.loads(out)
            total = sum(int(d.get("nc_count", 0)) for d in devices)
            if total:
                return list(range(total))
        except (subprocess.SubprocessError, ValueError, TypeError):
            pass
    devices = sorted(Path("/dev").glob("neuron[0-9]*"))
    family = _instance_family()
    if devices and family in CORES_PER_DEVICE:
        return list(range(len(devices) * CORES_PER_DEVICE[family]))
    raise NoFreeCoreGroup(
        "no NeuronCores found (neuron-ls is not installed or reports none, and no "
        f"/dev/neuron* devices on a known instance family): on a Neuron host install the "
        f"Neuron tools; to plan for another host set `neuron_cores` in the spec or "
        f"{NEURON_CORES_ENV}"
    )


def plan_groups(cores: list[int], cores_per_worker: int) -> list[CoreGroup]:
    if cores_per_worker < 1:
        raise ValueError("cores_per_worker must be at least 1")
    n = len(cores) // cores_per_worker
    if n == 0:
        raise NoFreeCoreGroup(
            f"cores_per_worker={cores_per_worker} but only {len(cores)} core(s) are available "
            f"({cores}); lower cores_per_worker"
        )
    return [
        CoreGroup(i, tuple(cores[i * cores_per_worker : (i + 1) * cores_per_worker]))
        for i in range(n)
    ]


def default_lease_dir() -> Path:
    env = os.environ.get(LEASE_DIR_ENV)
    if env:
        return Path(env)
    # Host-wide by default: cores belong to the host, not to one server or model.
    return Path(tempfile.gettempdir()) / f"neuronserve-{os.getuid()}" / "leases"


@dataclass
class CoreLease:
    kind: str
    group: CoreGroup
    groups_total: int
    _fds: list[int] = field(default_factory=list, repr=False)
    record: dict = field(default_factory=dict)

    @property
    def cores(self) -> tuple[int, ...]:
        return self.group.cores

    def note(self, **info) -> None:
        """Add to the record kept in the lock files (who holds the group, how it pinned)."""
        self.record.update(info)
        data = json.dumps(self.record).encode()
        for fd in self._fds:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)

    def release(self) -> None:
        for fd in self._fds:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        self._fds.clear()

    def __enter__(self) -> CoreLease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _lock_path(directory: Path, kind: str, core: int) -> Path:
    return directory / f"{kind}-core-{core}.lock"


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "unknown"
    return f"pid {info.get('pid', '?')} ({info.get('owner', '?')})"


def acquire(
    groups: list[CoreGroup],
    kind: str,
    owner: str = "",
    directory: Path | None = None,
    prefer: int | None = None,
) -> CoreLease:
    """Lease a group whose cores are all free (all-or-nothing per group).

    `prefer` is the group a worker with a known index should get (Triton instance
    index); if a live process still holds it (a restart racing its predecessor's exit
    is already covered by the kernel dropping the lock), the next free group is taken.
    """
    directory = Path(directory or default_lease_dir())
    directory.mkdir(parents=True, exist_ok=True)
    order = list(groups)
    if prefer is not None and groups:
        k = prefer % len(groups)
        order = order[k:] + order[:k]
    for group in order:
        fds: list[int] = []
        for core in group.cores:
            fd = _try_lock(_lock_path(directory, kind, core))
            if fd is None:
                break
            fds.append(fd)
        if len(fds) == len(group.cores):
            lease = CoreLease(kind=kind, group=group, groups_total=len(groups), _fds=fds)
            lease.note(pid=os.getpid(), owner=owner, group=group.index, cores=list(group.cores))
            return lease
        for fd in fds:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    held = "; ".join(
        f"group {g.index} (cores {g.label}) held by "
        + _holder(_lock_path(directory, kind, g.cores[0]))
        for g in groups
    )
    cpw = len(groups[0].cores) if groups else 0
    raise NoFreeCoreGroup(
        f"no free {kind} core group for this worker: the plan has {len(groups)} group(s) of "
        f"{cpw} core(s) and all are leased by live workers [{held}]. Run at most "
        f"{len(groups)} worker(s) (spec `workers`, TorchServe minWorkers/maxWorkers, Triton "
        "instance count) or lower `cores_per_worker`."
    )


def pin_cpu(cores: tuple[int, ...]) -> None:
    """Pin every thread of this process to `cores`, and size thread pools to match.

    Threads per worker must follow the cores it was given: two threads on one core
    ran ~5x slower than one here.
    """
    n = str(len(cores))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = n
    for tid in os.listdir("/proc/self/task"):
        # a thread may exit meanwhile
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(int(tid), cores)
    import torch

    torch.set_num_threads(len(cores))
    # raises once earlier parallel work in this process fixed the inter-op pool
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)


def discover(kind: str, neuron_cores: int | None = None) -> list[int]:
    if kind == "cpu":
        return discover_cpu_cores()
    if kind == "neuron":
        return discover_neuron_cores(neuron_cores)
    raise ValueError(f"unknown core kind {kind!r} (cpu or neuron)")


def pin_neuron(cores: tuple[int, ...], inf1_group_sizes: bool = False) -> None:
    """Make the Neuron runtime of this process see only `cores`.

    Must run before torch_neuronx / torch_neuron is imported: the runtime reads these
    variables once, when it initialises.
    """
    early = [m for m in NEURON_SDK_MODULES if m in sys.modules]
    if early:
        raise RuntimeError(
            f"{', '.join(early)} was imported before this worker pinned its "
            "NeuronCores; the runtime would already have claimed cores"
        )
    label = CoreGroup(0, cores).label
    os.environ["NEURON_RT_VISIBLE_CORES"] = label
    os.environ["NEURON_RT_NUM_CORES"] = str(len(cores))
    if inf1_group_sizes:
        # torch-neuron (Inf1) still reads the legacy variable: one group of all our cores.
        os.environ["NEURONCORE_GROUP_SIZES"] = str(len(cores))


def pin(lease: CoreLease, target: str | None = None) -> None:
    if lease.kind == "cpu":
        pin_cpu(lease.cores)
        import torch

        lease.note(threads=torch.get_num_threads(), affinity=sorted(os.sched_getaffinity(0)))
    elif lease.kind == "neuron":
        pin_neuron(lease.cores, inf1_group_sizes=target == "neuron")
        lease.note(visible_cores=os.environ["NEURON_RT_VISIBLE_CORES"])
    else:
        raise ValueError(f"cannot pin core kind {lease.kind!r}")
