"""The worker plan: which kind of core a target's workers lease, and how many workers
of how many cores this host holds.

Packaging (TorchServe workers, Triton instances), the SageMaker entrypoint and bench
all ask here; workers then lease one of the planned groups (`claim`) when they start.
The mechanisms (discovery, groups, locks, pinning) are in cores.py.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import cores, targets
from .cores import CoreGroup, CoreLease, NoFreeCoreGroup

if TYPE_CHECKING:
    from .artifact import Manifest
    from .spec import WorkerSection


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
    laid out (its worker section: layout, workers, cores_per_worker, neuron_cores)."""

    target: str
    layout: str = "throughput"
    workers: int | None = None
    cores_per_worker: int = 1
    neuron_cores: int | None = None
    # NeuronCores one compiled module needs (Inf1 pipeline mode; manifest compiler info)
    cores_per_module: int = 1

    @classmethod
    def of_target(
        cls, worker: WorkerSection, target: str, cores_per_module: int = 1
    ) -> PlanRequest:
        """The request for workers on `target` before any model is known (multi-model)."""
        return cls(
            target=target,
            layout=worker.layout,
            workers=worker.workers,
            cores_per_worker=worker.cores_per_worker,
            neuron_cores=worker.neuron_cores,
            cores_per_module=cores_per_module,
        )

    @classmethod
    def of(cls, worker: WorkerSection, manifests: Sequence[Manifest]) -> PlanRequest:
        """The request for serving `manifests` (one target) together: each worker holds
        every model, so it needs the most cores any of them is compiled for."""
        return cls.of_target(
            worker,
            manifests[0].target,
            max(int(m.compiler.get("cores_per_module", 1)) for m in manifests),
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


# What a CPU worker holds besides its models: the interpreter, torch, the tokenizer and the
# runtimes (the development guide's observations).
CPU_WORKER_OVERHEAD = 400 * 2**20
# a CPU runtime keeps the file it read and its own compiled copy of the weights
CPU_WEIGHT_COPIES = 2
# what the front and the workers' supervisor need beside the workers
HOST_RESERVE = 1 * GIB
# bytes of one activation value (float32 on every target's host side)
ACTIVATION_BYTES = 4


@dataclass(frozen=True)
class ModelMemory:
    name: str
    # what one worker (on Neuron: one NeuronCore) holds of it
    weights: int
    # the most one call of its largest bucket needs at once
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.activations


@dataclass(frozen=True)
class MemoryPlan:
    """Each worker's memory with every model loaded, against what a worker may use."""

    kind: str
    workers: int
    models: list[ModelMemory]
    overhead: int
    # per worker (per NeuronCore on Neuron); None when this host cannot tell
    budget: int | None
    where: str

    @property
    def need(self) -> int:
        """Every model's weights, the largest activations (a worker runs one call at a
        time) and the runtime's own."""
        largest = max((m.activations for m in self.models), default=0)
        return self.overhead + sum(m.weights for m in self.models) + largest

    @property
    def fits(self) -> bool:
        return self.budget is None or self.need <= self.budget

    def lines(self) -> list[str]:
        unit = "NeuronCore" if self.kind == "neuron" else "worker"
        out = [
            f"  {m.name}: weights {m.weights / 2**20:.0f} MiB, largest bucket's activations "
            f"{m.activations / 2**20:.0f} MiB"
            for m in self.models
        ]
        out.append(f"  runtime {self.overhead / 2**20:.0f} MiB")
        budget = f"{self.budget / 2**20:.0f} MiB" if self.budget is not None else "unknown"
        out.append(
            f"  per {unit}: {self.need / 2**20:.0f} MiB needed of {budget} ({self.where}); "
            f"{self.workers} worker(s), each holding every model"
        )
        return out

    def refusal(self) -> str:
        return (
            "these models do not fit: each worker holds every model, and\n"
            + "\n".join(self.lines())
            + "\nServe fewer models together, compile fewer or smaller buckets (batch sizes, "
            "sequence lengths), "
            + (
                "or use a NeuronCore with more memory (another instance family)"
                if self.kind == "neuron"
                else "run fewer workers (each holds every model: `workers`, or more "
                "`cores_per_worker`), or give the host more memory"
            )
        )


def memory_plan(
    models: Sequence[tuple[str, Manifest, Path]],
    worker_plan: WorkerPlan,
    family: str | None,
    target: str | None = None,
) -> MemoryPlan:
    """Estimate, before anything starts, what each worker holds with every model loaded:
    weights from the artifacts' modules (on Neuron the manifest's weight bytes, inlined in
    every bucket's module), the largest bucket's activations from the model's config, and
    the runtime's own; against the device memory of a NeuronCore of the instance family,
    or on CPU the host memory (less what the front and the supervisor need) per worker."""
    kind = worker_plan.kind
    found = [model_memory(name, m, path, kind) for name, m, path in models]
    if kind == "neuron":
        target = models[0][1].target if models else (target or "neuronx")
        key = "neuron" if target == "neuron" else (family or "inf2")
        core = CORE_MEMORY.get(key, CORE_MEMORY["inf2"])
        # what the runtime, instructions and activations take is the share weights leave
        overhead = int(core * (1 - WEIGHT_SHARE))
        return MemoryPlan(kind, worker_plan.workers, found, overhead, core, f"a {key} NeuronCore")
    total = _host_memory()
    budget = (total - HOST_RESERVE) // max(worker_plan.workers, 1) if total else None
    where = (
        f"host memory {total / GIB:.1f} GiB less {HOST_RESERVE / GIB:.0f} GiB for the front "
        f"and the supervisor, over {worker_plan.workers} worker(s)"
        if total
        else "host memory unknown"
    )
    return MemoryPlan(kind, worker_plan.workers, found, CPU_WORKER_OVERHEAD, budget, where)


def model_memory(name: str, manifest: Manifest, artifact: Path, kind: str) -> ModelMemory:
    """What one worker (on Neuron: one NeuronCore) holds of a model."""
    return ModelMemory(name, _weights(manifest, artifact, kind), _activations(manifest, artifact))


def model_budget(worker_plan: WorkerPlan, family: str | None, target: str) -> int | None:
    """Bytes each worker may fill with models: what a worker may use (memory_plan's
    budget) less its runtime's own; None when this host cannot tell."""
    plan = memory_plan([], worker_plan, family, target)
    return None if plan.budget is None else max(plan.budget - plan.overhead, 0)


def _host_memory() -> int | None:
    """This host's memory, or the cgroup's limit when lower (a container's)."""
    import psutil

    total = int(psutil.virtual_memory().total)
    for limit_file in ("memory.max", "memory/memory.limit_in_bytes"):
        try:
            text = (cores.CGROUP_ROOT / limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total or None


def _weights(manifest: Manifest, artifact: Path, kind: str) -> int:
    modules = sorted(set(manifest.modules.values()))
    if kind == "neuron":
        per_module = int(manifest.compiler.get("weight_bytes", 0)) / max(
            int(manifest.compiler.get("cores_per_module", 1)), 1
        )
        return int(per_module * len(modules))
    return CPU_WEIGHT_COPIES * sum(_unpacked_size(Path(artifact) / f) for f in modules)


def _unpacked_size(path: Path) -> int:
    """A module file's size once read: an OpenVINO build is a zip of its IR."""
    if not path.is_file():
        return 0
    if zipfile.is_zipfile(path) and path.suffix == ".openvino":
        with zipfile.ZipFile(path) as z:
            return sum(i.file_size for i in z.infolist())
    return os.path.getsize(path)


def _activations(manifest: Manifest, artifact: Path) -> int:
    """The most one encoder layer holds at once for the largest bucket: the hidden states
    with queries, keys, values and the attention output, the feed-forward's inner layer,
    and the attention scores and their softmax."""
    try:
        config = json.loads((Path(artifact) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    hidden = int(config.get("hidden_size") or config.get("dim") or 768)
    inner = int(config.get("intermediate_size") or config.get("hidden_dim") or 4 * hidden)
    heads = int(config.get("num_attention_heads") or config.get("n_heads") or 12)
    largest = 0
    for b in manifest.grid.buckets:
        seq = b.seq
        if manifest.image is not None:  # the bucket's "sequence" is the image height
            patch = int(config.get("patch_size", 16))
            seq = (manifest.image.shape[1] // patch) * (manifest.image.shape[2] // patch) + 1
        values = b.batch * seq * (5 * hidden + inner) + 2 * b.batch * heads * seq * seq
        largest = max(largest, values * ACTIVATION_BYTES)
    return largest
