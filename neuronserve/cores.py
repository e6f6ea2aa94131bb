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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .pids import alive
from .private_folders import NotPrivate, private_folder
from .waiting import until

LEASE_DIR_ENV = "NEURONSERVE_LEASE_DIR"
# the deployment a worker serves (its workers' run directory), set by `serve` for the
# workers and recorded in each lease: a worker that finds every group taken
# says whether its own deployment or another one holds them
DEPLOYMENT_ENV = "NEURONSERVE_DEPLOYMENT"
CORES_ENV = "NEURONSERVE_CORES"  # restrict discovery, e.g. "0-3" or "0,2"
NEURON_CORES_ENV = "NEURONSERVE_NEURON_CORES"  # how many NeuronCores the host has
NEURON_SDK_MODULES = ("torch_neuronx", "torch_neuron")
# NeuronCores per Neuron device, by instance family (for counting /dev/neuron*); trn2 in
# _cores_per_device
CORES_PER_DEVICE = {"inf1": 4, "inf2": 2, "trn1": 2, "trn1n": 2}
# what this process set NEURON_RT_VISIBLE_CORES to when it pinned itself: a value it set
# is not one it was given
PINNED_ENV = "NEURONSERVE_PINNED_CORES"
# where the CPU quota of this process's cgroup is read (cgroup v2, then v1)
CGROUP_ROOT = Path("/sys/fs/cgroup")


class NoFreeCoreGroup(RuntimeError):
    """Every core group of the plan is leased by a live worker."""


class LeaseDirError(RuntimeError):
    """The lease directory is not one this user alone controls."""


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


def cpu_quota(root: Path | None = None) -> float | None:
    """CPUs the cgroup's CFS quota allows (a Kubernetes CPU limit), or None without one."""
    root = root or CGROUP_ROOT
    try:
        quota, _, period = (root / "cpu.max").read_text().strip().partition(" ")
        if quota == "max":
            return None
        return int(quota) / int(period or 100000)
    except (OSError, ValueError):
        pass
    try:
        q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return q / p if q > 0 and p > 0 else None


def discover_cpu_cores() -> list[int]:
    """CPU cores from this process's affinity, narrowed by NEURONSERVE_CORES if set, and
    no more of them than the cgroup's CPU quota pays for.

    A Kubernetes pod with a CPU limit but no exclusive cpuset (CPU manager policy `none`)
    sees every core of the node in its affinity while its quota allows a few: one worker
    per visible core would leave each a fraction of a core. With the static policy and
    whole CPUs requested (Guaranteed QoS) the affinity holds just the pod's cores."""
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
        allowed = wanted
    quota = cpu_quota()
    if quota is not None and int(quota) < len(allowed):
        allowed = allowed[: max(1, int(quota))]
    return allowed


def instance_family() -> str | None:
    try:
        name = Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip()
    except OSError:
        return None
    return name.split(".")[0] if name else None


def discover_neuron_cores(override: int | None = None) -> list[int]:
    """NeuronCore ids this process may use, as NEURON_RT_VISIBLE_CORES numbers them.

    In order:
    - NEURON_RT_VISIBLE_CORES inherited from the environment: what a container was given
      (the Kubernetes device plugin sets it; `docker run --device ... --env
      NEURON_RT_VISIBLE_CORES=51,52` names host core ids, "Build and run a Neuron
      container": https://awsdocs-neuron.readthedocs-hosted.com/en/latest/containers/tutorials/build-run-neuron-container.html);
    - an explicit count: the spec's `neuron_cores`, then NEURONSERVE_NEURON_CORES;
    - `neuron-ls` JSON: the `neuroncore_ids` of each device it lists (only the devices
      a container was given, with the host's core ids:
      https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-sys-tools/neuron-ls.html);
    - /dev/neuron* devices times the cores per device of the instance family.
    """
    inherited = os.environ.get("NEURON_RT_VISIBLE_CORES")
    if inherited and os.environ.get(PINNED_ENV) != inherited:
        return parse_core_list(inherited)
    if override:
        return list(range(int(override)))
    env = os.environ.get(NEURON_CORES_ENV)
    if env:
        return list(range(int(env)))
    listed = _neuron_ls_cores()
    if listed:
        return listed
    devices = sorted(Path("/dev").glob("neuron[0-9]*"))
    family = instance_family()
    per_device = _cores_per_device(family)
    if devices and per_device:
        return sorted(c for d in devices for c in _device_cores(d, per_device))
    raise NoFreeCoreGroup(
        "no NeuronCores found (neuron-ls is not installed or reports none, and no "
        f"/dev/neuron* devices on a known instance family): on a Neuron host install the "
        f"Neuron tools; to plan for another host set `neuron_cores` in the spec or "
        f"{NEURON_CORES_ENV}"
    )


def _cores_per_device(family: str | None) -> int | None:
    if family is None:
        return None
    if family.startswith("trn2"):
        # Trn2 has 8 physical cores per device, grouped by default (LNC=2) into 4 logical
        # ones, which is what the runtime numbers: "Logical NeuronCore configuration",
        # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-features/logical-neuroncore-config.html
        return 8 // int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2"))
    return CORES_PER_DEVICE.get(family)


def _device_cores(device: Path, per_device: int) -> range:
    index = int(device.name.removeprefix("neuron"))
    return range(index * per_device, (index + 1) * per_device)


def _neuron_ls_cores() -> list[int]:
    """Core ids from `neuron-ls` JSON: `--json-output` (a list of devices), or the
    `--output-format json` that replaces it from Neuron 2.34 ("end of support for the
    neuron-ls JSON output format")."""
    import shutil
    import subprocess

    if not shutil.which("neuron-ls"):
        return []
    for flags in (["--json-output"], ["--output-format", "json"]):
        try:
            out = subprocess.run(
                ["neuron-ls", *flags], capture_output=True, text=True, timeout=30, check=True
            ).stdout
            cores = _cores_in(json.loads(out))
        except (subprocess.SubprocessError, OSError, ValueError, TypeError):
            continue
        if cores:
            return cores
    return []


def _cores_in(data: object) -> list[int]:
    if isinstance(data, dict):  # the newer format: devices below a top-level key
        data = next((v for v in data.values() if isinstance(v, list)), [])
    cores: list[int] = []
    offset = 0
    for device in data if isinstance(data, list) else []:
        ids = device.get("neuroncore_ids")
        if ids is None:  # older tools: a count per device, numbered in device order
            ids = list(range(offset, offset + int(device.get("nc_count", 0))))
        cores.extend(int(c) for c in ids)
        offset += len(ids)
    return sorted(cores)


def plan_groups(
    cores: list[int], cores_per_worker: int, contiguous: bool = False
) -> list[CoreGroup]:
    """Groups of `cores_per_worker` of `cores`, in order. With `contiguous` (NeuronCores:
    the runtime takes only a range a-b) a group never spans a gap in the ids."""
    if cores_per_worker < 1:
        raise ValueError("cores_per_worker must be at least 1")
    runs = _runs(sorted(cores)) if contiguous else [sorted(cores)]
    chunks = [
        run[i : i + cores_per_worker]
        for run in runs
        for i in range(0, len(run) - cores_per_worker + 1, cores_per_worker)
    ]
    if not chunks:
        gaps = " in a contiguous range" if contiguous and len(cores) >= cores_per_worker else ""
        raise NoFreeCoreGroup(
            f"cores_per_worker={cores_per_worker} but only {len(cores)} core(s) are available"
            f"{gaps} ({cores}); lower cores_per_worker"
        )
    return [CoreGroup(i, tuple(c)) for i, c in enumerate(chunks)]


def _runs(cores: list[int]) -> list[list[int]]:
    """[0, 1, 4, 5, 6] -> [[0, 1], [4, 5, 6]]"""
    runs: list[list[int]] = []
    for c in cores:
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return runs


def default_lease_dir() -> Path:
    env = os.environ.get(LEASE_DIR_ENV)
    if env:
        return Path(env)
    # Host-wide by default: cores belong to the host, not to one server or model. The
    # user's runtime directory is private by construction; a shared /tmp is not, so the
    # folders neuronserve makes there are checked (secure_dir).
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "neuronserve" / "leases"
    return Path(tempfile.gettempdir()) / f"neuronserve-{os.getuid()}" / "leases"


def secure_dir(path: Path, levels: int = 2) -> Path:
    """Create `path` (and up to `levels - 1` parents neuronserve owns) with mode 0700, and
    refuse it unless each is a real directory (not a symlink) owned by this user and not
    writable by others, under folders no other user can write (private_folders): in a
    shared /tmp another user could otherwise create the folder first, or plant a
    symlink, and read, redirect or hold every lease."""
    try:
        return private_folder(path, own=levels)
    except NotPrivate as e:
        raise LeaseDirError(
            f"lease directory {e}: remove it (or set {LEASE_DIR_ENV} to a private "
            "directory) and start again"
        ) from None


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
    # never through a symlink, readable by this user alone (the record names processes)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise LeaseDirError(
            f"lease file {path} cannot be opened safely ({e.strerror}): a symbolic link "
            "there is refused; remove it"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _record(path: Path) -> dict:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _holder(info: dict, deployment: str | None) -> str:
    """Who holds a group, as its lease record says: process, model, and whose
    deployment it serves."""
    who = f"pid {info.get('pid', '?')} ({info.get('owner', '?')})"
    theirs = info.get("deployment")
    if not theirs:
        return who
    if theirs == deployment:
        return f"{who} of this deployment"
    return f"{who} of another deployment (run directory {theirs})"


# how long a worker waits for a group whose holder died to be released
RELEASE_WAIT_S = 15.0


def _lease_one(order: list[CoreGroup], kind: str, directory: Path) -> CoreLease | None:
    """The first group of `order` whose cores are all free, leased; None if none is."""
    for group in order:
        fds: list[int] = []
        for core in group.cores:
            fd = _try_lock(_lock_path(directory, kind, core))
            if fd is None:
                break
            fds.append(fd)
        if len(fds) == len(group.cores):
            return CoreLease(kind=kind, group=group, groups_total=len(order), _fds=fds)
        for fd in fds:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    return None


def _holder_alive(path: Path) -> bool:
    """Whether the process a lock file names as its holder still runs (not a zombie)."""
    try:
        return alive(json.loads(path.read_text() or "{}").get("pid"))
    except (OSError, ValueError, AttributeError):
        return False


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
    The lease records this process, `owner` (engine and model) and the deployment in
    DEPLOYMENT_ENV; when no group is free the error names the holders from the same
    records.
    """
    # the default's private parent (neuronserve-<uid>) is checked too; a given folder alone
    given = directory is not None or bool(os.environ.get(LEASE_DIR_ENV))
    directory = Path(directory or default_lease_dir())
    deployment = os.environ.get(DEPLOYMENT_ENV) or None
    if given:
        directory.parent.mkdir(parents=True, exist_ok=True)
    secure_dir(directory, levels=1 if given else 2)
    order = list(groups)
    if prefer is not None and groups:
        k = prefer % len(groups)
        order = order[k:] + order[:k]

    # A worker replacing one that was killed can start before the dead one's lease is
    # free: the lock goes with the last descriptor, which a child of the dead worker may
    # still hold while it exits (on Neuron, the runtime's teardown). A failed start here
    # would cost TorchServe's growing retry backoff (1, 1, 2, 3, 5, 8 s ...), so while a
    # group's recorded holder is dead, wait for its lock instead of failing.
    def leased() -> CoreLease | bool:  # a lease, or True: none is on its way to free
        return _lease_one(order, kind, directory) or not any(
            not _holder_alive(_lock_path(directory, kind, g.cores[0])) for g in groups
        )

    lease = until(leased, RELEASE_WAIT_S, 0.1)
    if not isinstance(lease, CoreLease):
        raise NoFreeCoreGroup(_none_free(groups, kind, owner, directory, deployment))
    lease.note(
        pid=os.getpid(),
        owner=owner,
        group=lease.group.index,
        cores=list(lease.group.cores),
        deployment=deployment,
    )
    return lease


def _none_free(
    groups: list[CoreGroup], kind: str, owner: str, directory: Path, deployment: str | None
) -> str:
    """Why no group could be leased: who holds each, and what to do about it."""
    records = [_record(_lock_path(directory, kind, g.cores[0])) for g in groups]
    held = "; ".join(
        f"group {g.index} (cores {g.label}) held by {_holder(r, deployment)}"
        for g, r in zip(groups, records, strict=True)
    )
    cpw = len(groups[0].cores) if groups else 0
    others = sorted(
        {str(r["deployment"]) for r in records if r.get("deployment") not in (None, deployment)}
    )
    if others:
        todo = (
            f"Stop the other deployment(s) ({', '.join(others)}: `neuronserve serve ... --stop` "
            "with that run directory), or give this one cores they do not use "
            f"(NEURONSERVE_CORES, or {LEASE_DIR_ENV} only if the two never share a core). "
            f"This host has {len(groups)} group(s): run at most {len(groups)} worker(s) in "
            "all, or lower `cores_per_worker`."
        )
    else:
        models = sorted({str(r.get("owner")) for r in records if r.get("owner")} | {owner} - {""})
        todo = (
            f"Run at most {len(groups)} worker(s) (spec `workers`, TorchServe "
            "minWorkers/maxWorkers, Triton instance count) or lower `cores_per_worker`."
            + (
                f" Every model of a deployment starts its own workers ({', '.join(models)}): "
                "serve them together (`neuronserve serve front A B ...`, or `neuronserve "
                "package triton|torchserve A B ...`), so that each worker holds them all, or "
                "serve fewer."
                if len(models) > 1
                else ""
            )
        )
    return (
        f"no free {kind} core group for this worker ({owner or 'no owner given'}): the plan "
        f"has {len(groups)} group(s) of {cpw} core(s) and all are leased by live workers "
        f"[{held}]. {todo}"
    )


def pin_cpu(cores: tuple[int, ...]) -> None:
    """Pin every thread of this process to `cores`, and size thread pools to match.

    Threads per worker must follow the cores it was given: two threads on one core
    ran ~5x slower than one here.
    """
    n = str(len(cores))
    # the Rust tokenizer's own thread pool besides the worker's: off, as every server's
    # workers had it when neuronserve started them (Triton's and TorchServe's too)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
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


def pin_neuron(cores: tuple[int, ...]) -> None:
    """Make the Neuron runtime of this process see only `cores`.

    Must run before torch_neuronx / torch_neuron is imported: the runtime reads these
    variables once, when it initialises at the first model load ("Neuron Runtime
    configuration": https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/nrt-configurable-parameters.html).
    Nothing a worker imports before the pin imports them (the TorchServe handler is not
    TorchServe's BaseHandler, whose module imports torch_xla where installed), and this
    refuses to pin when one was; `neuronserve doctor` checks on a Neuron host that the
    runtime uses only the leased cores.
    NEURONCORE_GROUP_SIZES is not set: it is deprecated and no longer has an effect
    ("use NEURON_RT_VISIBLE_CORES or NEURON_RT_NUM_CORES instead").
    """
    early = [m for m in NEURON_SDK_MODULES if sys.modules.get(m) is not None]
    if early:
        raise RuntimeError(
            f"{', '.join(early)} was imported before this worker pinned its "
            "NeuronCores; the runtime would already have claimed cores"
        )
    label = CoreGroup(0, cores).label
    if "," in label:
        # "The resulting range must be contiguous" (Neuron runtime developer guide)
        raise NoFreeCoreGroup(
            f"NeuronCores {label} are not a contiguous range; the Neuron "
            "runtime takes a single core or a range a-b"
        )
    os.environ["NEURON_RT_VISIBLE_CORES"] = label
    os.environ[PINNED_ENV] = label
    os.environ["NEURON_RT_NUM_CORES"] = str(len(cores))


@contextlib.contextmanager
def neuron_pinned(cores: tuple[int, ...]) -> Iterator[None]:
    """pin_neuron for a while (compile, validate), then the variables as they were, so
    processes started later do not inherit them. The runtime keeps the cores it took."""
    names = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", PINNED_ENV)
    before = {n: os.environ.get(n) for n in names}
    pin_neuron(cores)
    try:
        yield
    finally:
        for n, v in before.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def neuron_device_present() -> bool:
    """Whether this host has a Neuron device a compiled module can be loaded on."""
    try:
        return bool(discover_neuron_cores())
    except NoFreeCoreGroup:
        return False


def pin(lease: CoreLease) -> None:
    if lease.kind == "cpu":
        pin_cpu(lease.cores)
        import torch

        lease.note(threads=torch.get_num_threads(), affinity=sorted(os.sched_getaffinity(0)))
    elif lease.kind == "neuron":
        pin_neuron(lease.cores)
        lease.note(visible_cores=os.environ["NEURON_RT_VISIBLE_CORES"])
    else:
        raise ValueError(f"cannot pin core kind {lease.kind!r}")
