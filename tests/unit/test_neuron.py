"""Neuron targets without Neuron hardware: compiler arguments, per-bucket modules and
manifest, discovery and pinning, checked against the stand-in SDK in
tests/neuron_standin (it records its calls and the process environment at import)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import STANDIN

from neuronserve import cores
from neuronserve.artifact import read_manifest
from neuronserve.compile import CompileError, compile_model, neuronx
from neuronserve.compile import neuron as inf1
from neuronserve.spec import SpecError, load_spec


def standin_events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in SDK importable in this process, recording into a fresh log."""
    log = tmp_path / "standin.jsonl"
    monkeypatch.setenv("NEURONSERVE_STANDIN_LOG", str(log))
    monkeypatch.syspath_prepend(str(STANDIN))
    for name in ("torch_neuronx", "torch_neuron", "_record"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return log


def test_neuronx_compiler_args():
    assert neuronx.compiler_args(
        {
            "auto_cast": "matmult",
            "auto_cast_type": "bf16",
            "optlevel": 3,
            "compiler_args": ["--verbose", "info"],
        }
    ) == [
        "--auto-cast",
        "matmult",
        "--auto-cast-type",
        "bf16",
        "--optlevel",
        "3",
        "--verbose",
        "info",
    ]
    with pytest.raises(ValueError, match="Inf1"):
        neuronx.compiler_args({"pipeline_cores": 4})


def test_inf1_compiler_args_and_pipeline_rule():
    import torch

    class Weights(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(n))

    assert inf1.default_pipeline_cores(Weights(110_000_000)) == 4 * round(5.5)
    assert inf1.default_pipeline_cores(Weights(1_000)) == 1  # never zero
    assert inf1.compiler_args(
        {"auto_cast": "all", "auto_cast_type": "fp16", "pipeline_cores": "auto"},
        Weights(40_000_000),
    ) == ["--fast-math", "fp32-cast-all-fp16", "--neuroncore-pipeline-cores", "8"]
    with pytest.raises(ValueError, match="tf32"):
        inf1.compiler_args({"auto_cast_type": "tf32"})
    with pytest.raises(ValueError, match="optlevel"):
        inf1.compiler_args({"optlevel": 2})


def test_neuron_options_refused_for_cpu():
    with pytest.raises(SpecError, match="auto_cast apply to the Neuron targets"):
        load_spec(None, {"target": "cpu", "auto_cast": "all"})


def test_missing_sdk_gives_the_install_command(tmp_path, classifier_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import fails like a missing SDK
    spec = load_spec(
        None,
        {
            "model": classifier_dir,
            "artifact": tmp_path / "a",
            "task": "text-classification",
            "target": "neuronx",
            "batch_sizes": [1],
            "sequence_lengths": [16],
        },
    )
    with pytest.raises(CompileError, match=r"pip install 'neuronserve\[neuronx\]'"):
        compile_model(spec, progress=False)


def test_neuronx_compiles_one_module_per_bucket(tmp_path, classifier_dir, standin):
    spec = load_spec(
        None,
        {
            "model": classifier_dir,
            "artifact": tmp_path / "art",
            "task": "text-classification",
            "target": "neuronx",
            "batch_sizes": [1, 4],
            "sequence_lengths": [16, 32],
            "auto_cast": "matmult",
            "auto_cast_type": "bf16",
            "optlevel": 2,
            "compiler_args": ["--model-type", "transformer"],
            "compiler_workdir": tmp_path / "wd",
            "compile_for": "inf2",
        },
    )
    compile_model(spec, progress=False)
    m = read_manifest(tmp_path / "art")
    assert m.target == "neuronx"
    assert set(m.modules) == {"b1_s16", "b1_s32", "b4_s16", "b4_s32"}
    want_args = [
        "--auto-cast",
        "matmult",
        "--auto-cast-type",
        "bf16",
        "--optlevel",
        "2",
        "--target",
        "inf2",
        "--model-type",
        "transformer",
    ]
    assert m.compiler["compiler_args"] == want_args
    assert m.compiler["compiler"] == "torch_neuronx 0.0.0+standin"
    assert m.compiler["inline_weights_to_neff"] is False
    assert m.compiler["artifact_bytes"] == sum(
        p.stat().st_size for p in (tmp_path / "art").iterdir() if p.name != "manifest.json"
    )
    assert len(m.validation) == 4
    traces = [e for e in standin_events(standin) if e["event"] == "trace"]
    # one trace per bucket, each with one example input per model input at that shape
    assert sorted(tuple(t["shapes"][0]) for t in traces) == [(1, 16), (1, 32), (4, 16), (4, 32)]
    for t in traces:
        assert t["compiler_args"] == want_args and t["inline_weights_to_neff"] is False
        assert len(t["shapes"]) == 3 and len({tuple(s) for s in t["shapes"]}) == 1
        assert t["compiler_workdir"].startswith(str(tmp_path / "wd"))
        assert t["extra"] == ["cpu_backend"]  # build-host compile: no device needed


def test_neuronx_bucket_modules_get_one_copy_of_the_weights(tmp_path, classifier_dir, standin):
    from safetensors.torch import load_file

    from neuronserve.runtime import Runner

    spec = load_spec(
        None,
        {
            "model": classifier_dir,
            "artifact": tmp_path / "art",
            "task": "text-classification",
            "target": "neuronx",
            "batch_sizes": [1, 4],
            "sequence_lengths": [16, 32],
        },
    )
    compile_model(spec, progress=False)
    m = read_manifest(tmp_path / "art")
    assert m.weights == "weights.safetensors" and (tmp_path / "art" / m.weights).is_file()
    Runner(tmp_path / "art", warmup=False)
    calls = [e for e in standin_events(standin) if e["event"] == "replace_weights"]
    # every bucket module was handed the very same tensors, read once from the artifact
    assert len(calls) == 4 and len({c["model"] for c in calls}) == 4
    assert len({c["first_tensor_ptr"] for c in calls}) == 1
    assert {c["tensors"] for c in calls} == {len(load_file(str(tmp_path / "art" / m.weights)))}


def test_inf1_target_records_pipeline_cores(tmp_path, classifier_dir, standin):
    spec = load_spec(
        None,
        {
            "model": classifier_dir,
            "artifact": tmp_path / "art",
            "task": "text-classification",
            "target": "neuron",
            "batch_sizes": [1],
            "sequence_lengths": [16],
            "auto_cast": "matmult",
            "pipeline_cores": 2,
        },
    )
    compile_model(spec, progress=False)
    m = read_manifest(tmp_path / "art")
    assert m.compiler["compiler_args"] == [
        "--fast-math",
        "fp32-cast-matmult",
        "--neuroncore-pipeline-cores",
        "2",
    ]
    assert m.compiler["cores_per_module"] == 2
    [trace] = [e for e in standin_events(standin) if e["event"] == "trace"]
    assert (
        trace["module"] == "torch_neuron" and trace["compiler_args"] == m.compiler["compiler_args"]
    )


def test_discovery_override_and_neuron_ls(tmp_path, monkeypatch):
    assert cores.discover_neuron_cores(3) == [0, 1, 2]
    monkeypatch.setenv(cores.NEURON_CORES_ENV, "4")
    assert cores.discover_neuron_cores() == [0, 1, 2, 3]
    monkeypatch.delenv(cores.NEURON_CORES_ENV)
    # A stand-in neuron-ls answering like an inf2.24xlarge (6 devices x 2 cores).
    tool = tmp_path / "bin" / "neuron-ls"
    tool.parent.mkdir()
    devices = [{"neuron_device": i, "nc_count": 2} for i in range(6)]
    tool.write_text(f"#!/bin/sh\necho '{json.dumps(devices)}'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    assert cores.discover_neuron_cores() == list(range(12))


def test_pinning_sets_runtime_variables_before_import(tmp_path):
    code = f"""
import os, sys, json
sys.path.insert(0, {str(STANDIN)!r})
from neuronserve import cores
groups = cores.plan_groups(cores.discover_neuron_cores(4), 2)
lease = cores.acquire(groups, "neuron", directory={str(tmp_path / "leases")!r}, prefer=1)
cores.pin(lease, target="neuron")
import torch_neuron
try:
    cores.pin_neuron((0,))
    late = "accepted"
except RuntimeError as e:
    late = str(e)
print(json.dumps({{"late": late}}))
"""
    log = tmp_path / "standin.jsonl"
    env = {**os.environ, "NEURONSERVE_STANDIN_LOG": str(log)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    [imported] = [e for e in standin_events(log) if e["event"] == "import"]
    assert imported["env"] == {
        "NEURON_RT_VISIBLE_CORES": "2-3",
        "NEURON_RT_NUM_CORES": "2",
        "NEURONCORE_GROUP_SIZES": "2",
    }
    assert "imported before this worker pinned" in json.loads(out)["late"]
