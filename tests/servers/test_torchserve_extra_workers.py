"""A plan with more TorchServe workers than this host has core groups: packaging warns,
and `serve` fails with the documented error instead of hanging, leaving nothing behind."""

from __future__ import annotations

import psutil
import pytest
from helpers import run_cli, write_spec

pytestmark = pytest.mark.server


def test_more_workers_than_groups_fails_at_start(tmp_path, classifier_artifact):
    groups = len(psutil.Process().cpu_affinity())
    write_spec(
        tmp_path,
        name="tiny-classifier",
        artifact=classifier_artifact,
        model_store="store",
        run_dir="run",
        cores_per_worker=1,
        workers=groups + 1,
    )
    pkg = run_cli("package", "torchserve", "--spec", "deploy.yaml", cwd=tmp_path)
    assert f"workers beyond {groups} will fail to start" in pkg.stderr
    proc = run_cli(
        "serve",
        "torchserve",
        "--spec",
        "deploy.yaml",
        "--timeout",
        "300",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 1
    assert "a worker failed to start" in proc.stderr
    assert f"Run at most {groups} worker(s)" in proc.stderr
    # the failed start cleaned up after itself
    assert not (tmp_path / "run/tmp/.model_server.pid").exists()
