"""The workers' store: one folder per deployment, `<store>/<name>/`, holding the
models (`models/<name>/`, each an artifact copied in) and `native.json`: the settings
every worker reads back (neuronserve.worker), how many workers the plan has, and each
worker's queue (the spec's worker section, as Triton and TorchServe packages read it)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from ..packaging.model import Packaged, found_in, put_in_place, staged
from ..sources import FoundModel
from .store import DEPLOYMENT_FILE, QueuePolicy, read_deployment


def packaged_models(source: Path) -> list[FoundModel] | None:
    """The models of a workers' store in `source`, with the settings they were packaged
    with; None when `source` holds none."""
    for found in sorted(Path(source).glob(f"*/{DEPLOYMENT_FILE}")):
        return found_in(found.parent, read_deployment(found.parent)[0])
    return None


def package_workers(store: Path, packaged: Packaged) -> Path:
    """Write the prepared models into the workers' store `store`; the deployment's
    folder."""
    with staged(store) as stage:
        model_dir = stage / packaged.name
        model_dir.mkdir()
        for m in packaged.models:
            shutil.copytree(m.artifact, model_dir / m.folder)
        deployment = {
            "settings": packaged.settings.model_dump(),
            "workers": packaged.plan.workers,
            "queue": asdict(QueuePolicy.of(packaged.worker)),
        }
        (model_dir / DEPLOYMENT_FILE).write_text(json.dumps(deployment, indent=1))
        return put_in_place(model_dir, store)
