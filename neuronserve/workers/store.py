"""The workers' store, as their processes read it back: each deployment's folder
holds `native.json` (the settings every worker reads, neuronserve.worker; how many
workers the plan has; each worker's queue). Light on purpose: a worker reads it before
it pins itself to its cores, so nothing here imports torch (nor numpy)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..worker import WorkerSettings

if TYPE_CHECKING:
    from ..spec import WorkerSection

DEPLOYMENT_FILE = "native.json"


@dataclass(frozen=True)
class QueuePolicy:
    """Each worker's queue: how many requests may wait (beyond: 503 at once), how long
    one may wait (beyond: 503), how long a lone request is held to fill a batch, and how
    long one batch may run before its worker is taken for hung."""

    max_queued: int
    queue_timeout_s: float | None
    batch_delay_s: float
    hang_s: float

    @classmethod
    def of(cls, w: WorkerSection) -> QueuePolicy:
        return cls(
            max_queued=w.max_queued,
            queue_timeout_s=w.queue_timeout_ms / 1000 if w.queue_timeout_ms else None,
            batch_delay_s=w.max_batch_delay_ms / 1000,
            hang_s=float(w.response_timeout_s),
        )


def read_deployment(model_dir: Path) -> tuple[WorkerSettings, int, QueuePolicy]:
    """The settings a store's deployment was packaged with, its workers and their queue."""
    data: dict[str, Any] = json.loads((Path(model_dir) / DEPLOYMENT_FILE).read_text())
    queue = QueuePolicy(**data["queue"])
    return WorkerSettings.model_validate(data["settings"]), int(data["workers"]), queue


def models_in(store: Path) -> list[str]:
    return sorted(p.parent.name for p in Path(store).glob(f"*/{DEPLOYMENT_FILE}"))
