"""`neuronserve soak` as CI runs it: 1,000 requests at concurrency 32, a fifth of them
malformed, one worker SIGKILLed 40% of the way through, for TorchServe asked directly
and for Triton behind the front (a tiny model there). The command checks every answer
against the Runner and exits 1 on any defect; the report is read back here for what
each engine must show: TorchServe replaces the worker, the healer reloads Triton's model
while the front says 503 with Retry-After (never 500), and both leave nothing behind."""

from __future__ import annotations

import json
import os

import pytest
from helpers import run_cli

pytestmark = pytest.mark.server


@pytest.fixture(autouse=True)
def two_cores():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPU cores for two workers")


def soak(artifact, tmp_path, engine: str, via: str) -> dict:
    out = tmp_path / f"{engine}.json"
    proc = run_cli(
        "soak", artifact, "--engine", engine, "--via", via, "--requests", "1000",
        "--concurrency", "32", "--malformed", "0.2", "--kill-at", "0.4", "--out", out,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["wrong"] == 0 and report["failed"] == 0 and report["malformed_not_4xx"] == 0
    assert report["malformed_4xx"] == report["malformed"] > 100
    assert report["answered"] > 300
    assert report["lost_at_kill"] <= 32  # at most the requests in flight on the killed worker
    assert report["killed_pid"] and report["recovered_s"] is not None
    assert report["sequential"] == "20/20" and report["sequential_ok_s"] < 60
    assert report["left_processes"] == report["left_leases"] == report["left_temp"] == []
    return report


def test_torchserve_replaces_a_killed_worker(minilm_artifact, tmp_path):
    report = soak(minilm_artifact, tmp_path, "torchserve", "engine")
    assert report["memory_growth_pct"] is not None and report["memory_growth_pct"] < 10


def test_triton_heals_and_the_front_says_503_meanwhile(tiny_artifact, tmp_path):
    # the tiny model: what is tested is the healer and the front, and MiniLM's reload
    # only lengthens the outage the test waits through
    report = soak(tiny_artifact, tmp_path, "triton", "front")
    assert "500" not in report["statuses"]
    assert report["unavailable"] > 0  # requests while the model reloaded: 503 + Retry-After
