"""The worker plan (placement.py) and what the packagers write from it."""

from __future__ import annotations

import pytest
from helpers import package_for

from neuronserve import placement
from neuronserve.cores import discover
from neuronserve.placement import PlacementError, PlanRequest, plan
from neuronserve.spec import load_spec


def test_core_kind_is_the_targets():
    assert placement.core_kind("cpu") == "cpu"
    assert placement.core_kind("neuronx") == "neuron" == placement.core_kind("neuron")


def test_throughput_and_latency_layouts():
    n = len(discover("cpu"))
    assert plan(PlanRequest("cpu")) == placement.WorkerPlan("cpu", n, 1, n)
    assert plan(PlanRequest("cpu", layout="latency")) == placement.WorkerPlan("cpu", 1, n, 1)


def test_neuron_groups_and_pipeline_cores(monkeypatch):
    monkeypatch.setenv("NEURONSERVE_NEURON_CORES", "8")
    assert plan(PlanRequest("neuronx", cores_per_worker=2)).workers == 4
    p = plan(PlanRequest("neuron", cores_per_worker=4, cores_per_module=4))
    assert (p.workers, p.cores_per_worker, p.groups) == (2, 4, 2)
    with pytest.raises(PlacementError, match="compiled for 4 NeuronCores per model"):
        plan(PlanRequest("neuron", cores_per_module=4))


def test_build_host_without_the_cores(monkeypatch):
    monkeypatch.delenv("NEURONSERVE_NEURON_CORES", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no neuron-ls
    # packaging for an Inf2 host on a machine without NeuronCores needs the worker count
    p = plan(PlanRequest("neuronx", workers=2))
    assert (p.workers, p.groups, p.oversubscribed) == (2, None, False)
    with pytest.raises(PlacementError, match=r"no NeuronCores found.*or pass --workers"):
        plan(PlanRequest("neuronx"))
    # the serving host must have them
    with pytest.raises(PlacementError, match="no NeuronCores found"):
        plan(PlanRequest("neuronx", workers=2), serving_host=True)


def test_more_workers_than_groups_is_a_warning_or_capped():
    n = len(discover("cpu"))
    asked = PlanRequest("cpu", workers=n + 3)
    p = plan(asked)
    assert p.workers == n + 3 and p.oversubscribed
    assert f"workers beyond {n} will fail to start" in p.warning()
    assert plan(asked, serving_host=True).workers == n


def test_packagers_write_the_plan(tmp_path, tiny_artifact):
    from neuronserve.buckets import engine_batch_sizes
    from neuronserve.packaging.model import prepare
    from neuronserve.packaging.torchserve import model_config
    from neuronserve.packaging.triton import read_config

    n = len(discover("cpu"))
    latency = load_spec(None, {"layout": "latency", "batch_requests": 2, "artifact": tiny_artifact})
    cfg = model_config(latency.torchserve, prepare(latency))
    assert (cfg["minWorkers"], cfg["neuronserve"]["cores_per_worker"]) == (1, n)
    assert cfg["batchSize"] == 2
    throughput = load_spec(None, {"artifact": tiny_artifact})
    packaged = prepare(throughput)
    cfg = model_config(throughput.torchserve, packaged)
    assert (cfg["minWorkers"], cfg["neuronserve"]["cores_per_worker"]) == (n, 1)
    # the largest batch the artifact's bucket times say is worth forming
    m = packaged.models[0].manifest
    assert cfg["batchSize"] == max(engine_batch_sizes(m.grid, m.bucket_ms))
    assert cfg["batchSize"] in m.grid.batch_sizes
    # Triton: one instance holding every core
    spec = load_spec(
        None,
        {"layout": "latency", "triton_repository": tmp_path / "repo", "artifact": tiny_artifact},
    )
    config = read_config(package_for("triton", spec) / "config.pbtxt")
    assert [(g.name, g.count) for g in config.instance_group] == [("cores0", 1)]
    assert config.parameters["neuronserve_cores_per_worker"].string_value == str(n)
