"""The worker plan: which kind of core a target's workers lease, and how many workers
of how many cores this host holds.

Packaging (TorchServe workers, Triton instances), the SageMaker entrypoint and bench
all ask here; workers then lease one of the planned groups (`claim`) when they start.
The mechanisms (discovery, groups, locks, pinning) are in cores.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import cores
from .compile import targets
from .cores import CoreGroup, CoreLease, NoFreeCoreGroup

if TYPE_CHECKING:
    from .artifact import Manifest
    from .spec import DeploySpec


class PlacementError(RuntimeError):
    """The requested layout cannot be placed on this host."""


def core_kind(target: str) -> str:
    """The kind of core a worker of `target` leases: "cpu" or "neuron" (the target
    registry's; it imports no torch, so workers may ask before they pin)."""
    return targets.core_kind(target)


def groups(kind: str, cores_per_worker: int, neuron_cores: int | None = None) -> list[CoreGroup]:
    """This host's core groups for workers of `cores_per_worker` cores."""
    return cores.plan_groups(
        cores.discover(kind, neuron_cores), cores_per_worker, contiguous=kind == "neuron"
    )


@dataclass(frozen=True)
class WorkerPlan:
    kind: str
    workers: int
    cores_per_worker: int
    # groups of cores_per_worker cores on this host; None when it has no core of this
    # kind (packaging on a build host for another one)
    groups: int | None

    @property
    def oversubscribed(self) -> bool:
        """More workers than this host has groups: the extra ones will fail at start."""
        return self.groups is not None and self.workers > self.groups

    def warning(self, what: str = "workers") -> str | None:
        if not self.oversubscribed:
            return None
        return (
            f"{self.workers} {what} but this host has {self.groups} core group(s) of "
            f"{self.cores_per_worker} core(s); {what} beyond {self.groups} will fail to "
            "start unless the serving host has more cores"
        )


@dataclass(frozen=True)
class PlanRequest:
    """What a deployment asks for: the artifact's target and how its workers should be
    laid out (see DeploySpec: layout, workers, cores_per_worker, neuron_cores)."""

    target: str
    layout: str = "throughput"
    workers: int | None = None
    cores_per_worker: int = 1
    neuron_cores: int | None = None
    # NeuronCores one compiled module needs (Inf1 pipeline mode; manifest compiler info)
    cores_per_module: int = 1

    @classmethod
    def of(cls, spec: DeploySpec, manifest: Manifest) -> PlanRequest:
        return cls(
            target=manifest.target,
            layout=spec.layout,
            workers=spec.workers,
            cores_per_worker=spec.cores_per_worker,
            neuron_cores=spec.neuron_cores,
            cores_per_module=int(manifest.compiler.get("cores_per_module", 1)),
        )


def plan(request: PlanRequest, serving_host: bool = False) -> WorkerPlan:
    """Workers for this host.

    `layout: latency` is one worker holding every core. `workers` defaults to one per
    group. On the `serving_host` (the SageMaker entrypoint) more workers than groups are
    cut to the groups and a host without such cores is an error; packaging may run on a
    build host for another one, so it keeps what was asked (`WorkerPlan.warning` says
    what will happen) and needs `workers` where this host has none of those cores.
    """
    kind = core_kind(request.target)
    cpw = request.cores_per_worker
    if request.layout == "latency":
        try:
            cpw = max(len(cores.discover(kind, request.neuron_cores)), 1)
        except NoFreeCoreGroup as e:
            raise PlacementError(f"layout latency needs this host's cores: {e}") from None
    if cpw < request.cores_per_module:
        raise PlacementError(
            f"the artifact was compiled for {request.cores_per_module} NeuronCores per model "
            f"(pipeline mode) but cores_per_worker is {cpw}: set cores_per_worker to "
            f"{request.cores_per_module} or a multiple of it"
        )
    try:
        n = len(groups(kind, cpw, request.neuron_cores))
    except NoFreeCoreGroup as e:
        if serving_host:
            raise PlacementError(str(e)) from None
        if request.workers:
            return WorkerPlan(kind, request.workers, cpw, None)
        raise PlacementError(f"{e}; or pass --workers") from None
    workers = 1 if request.layout == "latency" else (request.workers or n)
    if serving_host:
        workers = min(workers, n)
    return WorkerPlan(kind, workers, cpw, n)


def claim(
    kind: str,
    cores_per_worker: int,
    owner: str = "",
    prefer: int | None = None,
    neuron_cores: int | None = None,
) -> CoreLease:
    """Lease one group of this host's plan (in cores.default_lease_dir()); raises
    NoFreeCoreGroup with what to change."""
    return cores.acquire(
        groups(kind, cores_per_worker, neuron_cores), kind, owner=owner, prefer=prefer
    )


# Device memory per NeuronCore, by target and instance family: Inferentia has 8 GiB per
# chip shared by its 4 cores ("Inferentia architecture", https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/inferentia.html);
# Inferentia2 and Trainium 32 GiB per chip of 2 cores (inf2 and trn1 architecture
# pages); Trainium2 96 GiB per chip of 4 logical cores.
GIB = 2**30
CORE_MEMORY = {
    "neuron": 8 * GIB // 4,
    "inf2": 16 * GIB,
    "trn1": 16 * GIB,
    "trn1n": 16 * GIB,
    "trn2": 24 * GIB,
}
# what the runtime, instructions and activations leave for weights
WEIGHT_SHARE = 0.8


def device_memory_problem(
    target: str,
    modules: int,
    weight_bytes: int,
    cores_per_module: int = 1,
    family: str | None = None,
) -> str | None:
    """Why a worker's modules cannot fit on its NeuronCores, or None. Every bucket module
    holds its own weights (inlined in its NEFF), so a core holds weights x buckets (a
    pipelined Inf1 model spreads its weights over its cores)."""
    if core_kind(target) != "neuron" or not weight_bytes:
        return None
    budget = CORE_MEMORY.get(
        "neuron" if target == "neuron" else (family or "inf2"), CORE_MEMORY["inf2"]
    )
    per_module = weight_bytes / max(cores_per_module, 1)
    need = per_module * modules
    if need <= budget * WEIGHT_SHARE:
        return None
    fits = int(budget * WEIGHT_SHARE // per_module)
    where = (
        "an Inf1 NeuronCore (8 GiB per chip shared by 4 cores)"
        if target == "neuron"
        else f"a {family or 'inf2'} NeuronCore"
    )
    return (
        f"the {modules} bucket modules need {need / GIB:.1f} GiB per NeuronCore (each "
        f"holds {per_module / 1e6:.0f} MB of weights), more than {WEIGHT_SHARE:.0%} of the "
        f"{budget / GIB:.0f} GiB of {where}: compile at most {fits} bucket(s) (fewer batch "
        "sizes or sequence lengths)" + (", or more pipeline cores" if target == "neuron" else "")
    )
