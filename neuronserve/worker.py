"""The contract between packaging and the two server adapters (the TorchServe handler
in handlers/ and the Triton model.py in triton_backend/): the settings a packaged
model carries, under one set of names, and one worker start.

Packaging writes `WorkerSettings` into the model (TorchServe: the `neuronserve` section
of the archive's model-config.yaml; Triton: `neuronserve_*` parameters of config.pbtxt)
and the adapter reads it back with the same class. `start_worker` then leases a core
group, pins to it and only then loads the Runner: thread pools and the Neuron runtime
read their settings once, when they initialise, so nothing here imports torch or the
Neuron SDK before the pin.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from . import cores, placement

if TYPE_CHECKING:
    from .runtime import Runner

# TorchServe: the section of model-config.yaml holding the settings
CONFIG_SECTION = "neuronserve"
# Triton: the prefix of the config.pbtxt parameters holding them
PARAM_PREFIX = "neuronserve_"
# where the artifact sits in a .mar and in a Triton model version folder
ARTIFACT_DIR = "artifact"
# a TorchServe worker that cannot start logs one line with this; `serve` reports it
FAILURE_MARKER = "neuronserve: worker failed to start:"


class WorkerSettings(BaseModel):
    artifact: str = ARTIFACT_DIR
    target: str
    core_kind: str
    cores_per_worker: int = 1
    neuron_cores: int | None = None
    # None: what the artifact's manifest recorded
    truncation: bool | None = None
    # most texts one request may hold, characters one text may hold (None: no limit),
    # deepest JSON nesting of a body
    max_client_batch: int | None = None
    max_text_chars: int | None = None
    max_json_depth: int = 32

    def torchserve_section(self) -> dict[str, Any]:
        return {CONFIG_SECTION: self.model_dump()}

    @classmethod
    def from_torchserve(cls, model_yaml_config: dict[str, Any] | None) -> WorkerSettings:
        return cls.model_validate((model_yaml_config or {}).get(CONFIG_SECTION, {}))

    def triton_parameters(self) -> dict[str, str]:
        """config.pbtxt parameters (string values; None is left out)."""
        return {
            PARAM_PREFIX + k: str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in self.model_dump().items()
            if v is not None
        }

    @classmethod
    def from_triton(cls, model_config: dict[str, Any]) -> WorkerSettings:
        """From the model config Triton hands `initialize` (JSON, parameters as
        {"string_value": ...})."""
        params = model_config.get("parameters", {})
        return cls.model_validate(
            {
                k[len(PARAM_PREFIX) :]: v["string_value"]
                for k, v in params.items()
                if k.startswith(PARAM_PREFIX)
            }
        )


@dataclass
class Worker:
    lease: cores.CoreLease
    runner: Runner
    # seconds from the call to start_worker until the lease was held, and until ready
    leased_s: float = 0.0
    ready_s: float = 0.0

    def describe(self) -> str:
        g = self.lease.group
        return (
            f"pid {os.getpid()} leased {self.lease.kind} core group {g.index} (cores "
            f"{g.label}) after {self.leased_s:.2f}s; buckets "
            f"{', '.join(b.key for b in self.runner.grid.buckets)} loaded and warmed up, "
            f"ready after {self.ready_s:.2f}s"
        )

    def stop(self) -> None:
        self.lease.release()


def start_worker(
    settings: WorkerSettings, model_dir: Path | str, owner: str, prefer: int | None = None
) -> Worker:
    """Lease a core group of this host's plan, pin this process to it, then load and
    warm up the artifact in `model_dir`. Raises NoFreeCoreGroup (naming what to change)
    when every group is held by a live worker.

    `prefer` is the group a worker with a known index should get (Triton's instance
    index); TorchServe gives its workers none, so they take the first free group.
    """
    started = time.monotonic()
    lease = placement.claim(
        settings.core_kind,
        settings.cores_per_worker,
        owner=owner,
        prefer=prefer,
        neuron_cores=settings.neuron_cores,
    )
    leased = time.monotonic() - started
    try:
        cores.pin(lease)
        from .runtime import Runner
        from .tasks.base import RequestLimits

        runner = Runner(
            Path(model_dir) / settings.artifact,
            truncation=settings.truncation,
            cores=len(lease.cores),
            limits=RequestLimits(
                settings.max_client_batch, settings.max_text_chars, settings.max_json_depth
            ),
        )
    except BaseException:
        lease.release()
        raise
    return Worker(lease, runner, leased, time.monotonic() - started)
