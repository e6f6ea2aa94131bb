"""The Neuron targets against the stand-in SDK (tests/neuron_standin), which behaves as
the AWS Neuron documentation says the SDK does: XLA-like tracing (torch.jit.is_tracing()
False), the compilers' default auto-cast, no loading or running without a device, a
per-call weight copy for weight-separated modules never moved to the device, round-robin
placement, a container's core subset, neuron-ls with neuroncore_ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    REPO,
    STANDIN,
    compile_model,
    run_cli,
    standin_env,
    standin_events,
    standin_process,
)

from neuronserve import cores, placement
from neuronserve.artifact import read_manifest
from neuronserve.compile import CompileError, neuronx
from neuronserve.compile import neuron as inf1
from neuronserve.spec import load_spec


def spec(tmp_path, model, target="neuronx", **fields):
    return load_spec(
        None,
        {
            "model": model,
            "artifact": tmp_path / "art",
            "task": "text-classification",
            "target": target,
            "batch_sizes": [1, 4],
            "sequence_lengths": [16, 32],
            **fields,
        },
    )


@pytest.fixture
def log(tmp_path):
    return tmp_path / "standin.jsonl"


# --- precision is what the compiler does (neuronx-cc / neuron-cc CLI references) ---------


def test_neuronx_compiler_args_make_the_precision_explicit():
    assert neuronx.cast_args({"precision": "fp32"}) == (["--auto-cast", "none"], "fp32")
    assert neuronx.cast_args({"precision": "bf16"}) == (
        ["--auto-cast", "matmult", "--auto-cast-type", "bf16"],
        "bf16",
    )
    assert neuronx.cast_args({"precision": "auto"})[1] == "bf16"
    # the README's own example: explicit compiler flags decide the precision
    assert neuronx.cast_args({"auto_cast": "matmult", "auto_cast_type": "bf16"})[1] == "bf16"
    assert neuronx.cast_args({"auto_cast": "none"})[1] == "fp32"
    with pytest.raises(ValueError, match="runs bf16, not precision fp32"):
        neuronx.cast_args({"auto_cast": "matmult", "precision": "fp32"})
    with pytest.raises(ValueError, match="no precision 'int8'"):
        neuronx.cast_args({"precision": "int8"})
    args = neuronx.compiler_args(
        {"precision": "fp32", "optlevel": 3, "compiler_args": ["--verbose", "info"]}
    )
    assert args == [
        "--auto-cast",
        "none",
        "--optlevel",
        "3",
        "--model-type",
        "transformer",
        "--verbose",
        "info",
    ]
    # a model type given by the user replaces ours
    assert "transformer" not in neuronx.compiler_args(
        {"precision": "fp32", "compiler_args": ["--model-type", "generic"]}
    )
    with pytest.raises(ValueError, match="Inf1"):
        neuronx.compiler_args({"pipeline_cores": 4})


def test_inf1_has_no_fp32_and_maps_bf16_to_its_fast_math():
    assert inf1.fast_math({"precision": "bf16"}) == (
        ["--fast-math", "fp32-cast-matmult-bf16"],
        "bf16",
    )
    assert inf1.fast_math({"precision": "auto"})[1] == "bf16"
    assert inf1.fast_math({"auto_cast": "matmult", "auto_cast_type": "fp16"}) == (
        ["--fast-math", "fp32-cast-matmult-fp16"],
        "fp16",
    )
    # --fast-math none still runs matmults in BF16
    assert inf1.fast_math({"auto_cast": "none"}) == (["--fast-math", "none"], "bf16")
    with pytest.raises(ValueError, match="no precision fp32: neuron-cc runs matmults in BF16"):
        inf1.fast_math({"precision": "fp32"})
    with pytest.raises(ValueError, match="tf32"):
        inf1.fast_math({"auto_cast_type": "tf32"})


# The tiny random classifier's logits are ~100x smaller than a trained model's, and so is the
# error bf16 puts in them: a tolerance of 1e-4 here stands for the default 1e-3 on BERT.


def test_neuronx_fp32_compiles_with_auto_cast_none(tmp_path, classifier_dir, log):
    with standin_process(4, log=log):
        compile_model(
            spec(tmp_path, classifier_dir, precision="fp32", tolerance=1e-4), progress=False
        )
    m = read_manifest(tmp_path / "art")
    assert m.precision == "fp32" and m.compiler["compiler_args"][:2] == ["--auto-cast", "none"]
    assert m.validation_status == "passed"
    # the stand-in's compiler would have cast matmuls to bf16 by default (SDK 2.21)
    assert {t["auto_cast"] for t in standin_events(log, "trace")} == {"none"}
    assert max(v.max_abs_diff for v in m.validation) <= m.tolerance


def test_neuronx_auto_records_bf16_judged_by_the_accuracy_floor(tmp_path, classifier_dir, log):
    with standin_process(4, log=log):
        compile_model(spec(tmp_path, classifier_dir), progress=False)
    m = read_manifest(tmp_path / "art")
    assert m.precision == "bf16"
    assert m.compiler["compiler_args"][:4] == ["--auto-cast", "matmult", "--auto-cast-type", "bf16"]
    assert m.accuracy["argmax_agreement"] >= 0.99 and m.accuracy["max_abs_diff"] > 1e-6
    assert [t.precision for t in m.precision_trials] == ["bf16"]  # the first that passes
    assert {t["auto_cast"] for t in standin_events(log, "trace")} == {"matmult"}


def test_inf1_compiles_bf16_not_held_to_fp32_tolerance(tmp_path, classifier_dir, log):
    with standin_process(4, log=log):
        compile_model(
            spec(tmp_path, classifier_dir, target="neuron", tolerance=1e-4), progress=False
        )
    m = read_manifest(tmp_path / "art")
    assert m.precision == "bf16" and m.validation_status == "passed"
    assert m.compiler["compiler_args"] == ["--fast-math", "fp32-cast-matmult-bf16"]
    assert max(v.max_abs_diff for v in m.validation) > 1e-5  # really bf16
    with pytest.raises(CompileError, match="no precision fp32"):
        compile_model(
            spec(tmp_path / "x", classifier_dir, target="neuron", precision="fp32"), progress=False
        )


# --- build hosts: save without loading, validate on the serving host ------------------


def test_compile_for_saves_unchecked_and_validate_checks_on_the_host(
    tmp_path, classifier_dir, log, caplog
):
    from neuronserve.compile.check import validate_artifact
    from neuronserve.runtime import Runner

    with standin_process(0, log=log):  # a build host: no Neuron device
        compile_model(spec(tmp_path, classifier_dir, compile_for="inf2"), progress=False)
    m = read_manifest(tmp_path / "art")
    assert m.validation_status == "pending" and "build host" in m.validation_note
    assert m.validation == [] and m.precision == "bf16"
    assert standin_events(log, "load") == []  # nothing was loaded on the build host
    assert all("cpu_backend" in t["extra"] for t in standin_events(log, "trace"))
    with standin_process(0), pytest.raises(CompileError, match=r"cannot check .* no Neuron"):
        validate_artifact(tmp_path / "art")
    with standin_process(4, log=log), caplog.at_level("WARNING"):
        Runner(tmp_path / "art", warmup=False)
    assert "neuronserve validate" in caplog.text
    # once the process above has let its NeuronCores go: a core serves one process
    out = run_cli("validate", tmp_path / "art", env={**os.environ, **standin_env(4)})
    assert "validation passed on this host" in out.stdout
    m = read_manifest(tmp_path / "art")  # the checksums still hold
    assert m.validation_status == "passed" and "checked on" in m.validation_note
    assert len(m.validation) == 4 and m.accuracy["argmax_agreement"] >= 0.99


def test_inf1_compiles_anywhere_and_leaves_the_check_to_the_host(tmp_path, classifier_dir):
    with standin_process(0):
        compile_model(spec(tmp_path, classifier_dir, target="neuron"), progress=False)
    assert read_manifest(tmp_path / "art").validation_status == "pending"


def test_compile_for_needs_an_sdk_with_cpu_backend(tmp_path, classifier_dir):
    with (
        standin_process(0, sdk="2.20.2"),
        pytest.raises(CompileError, match=r"Neuron SDK 2\.21 or later"),
    ):
        compile_model(spec(tmp_path, classifier_dir, compile_for="inf2"), progress=False)


def test_a_failed_check_is_recorded_and_refused_at_load(tmp_path, classifier_dir):
    from neuronserve.artifact import ArtifactError
    from neuronserve.compile.check import validate_artifact
    from neuronserve.runtime import Runner

    with standin_process(0):
        compile_model(
            spec(
                tmp_path,
                classifier_dir,
                compile_for="inf2",
                min_cosine=1.0,
                task="feature-extraction",
                pooling="mean",
            ),
            progress=False,
        )
    # the stand-in compiler casts to bf16; a floor no bf16 model meets refuses it on the host
    with standin_process(4), pytest.raises(CompileError, match="refused on this host"):
        validate_artifact(tmp_path / "art")
    assert read_manifest(tmp_path / "art").validation_status == "failed"
    with pytest.raises(ArtifactError, match="failed its check"):
        Runner(tmp_path / "art", warmup=False)


# --- weights stay in the NEFF; padded batch-1 requests; several cores per worker ------


def test_weights_are_inlined_and_never_copied_per_call(neuronx_artifact, neuronx_runner, log):
    m = read_manifest(neuronx_artifact)
    assert m.compiler["inline_weights_to_neff"] is True and m.compiler["weight_bytes"] > 0
    with standin_process(4, log=log):
        neuronx_runner.responses_for_bodies([({"inputs": ["a", "b c d"]}, None)])
    assert standin_events(log, "execute") and standin_events(log, "weight_copy") == []


def test_the_standin_records_weights_left_on_the_host(tmp_path, log):
    """What the check above would catch: a weight-separated trace copies its weights on
    every call until torch_neuronx.move_trace_to_device."""

    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, a, b):
            return self.linear(a + b)

    with standin_process(4, log=log):
        import torch_neuronx

        trace = torch_neuronx.trace(
            TwoInputs(), (torch.ones(1, 4), torch.ones(1, 4)), inline_weights_to_neff=False
        )
        trace(torch.ones(1, 4), torch.ones(1, 4))
        assert len(standin_events(log, "weight_copy")) == 1
        torch_neuronx.move_trace_to_device(trace, 0)
        trace(torch.ones(1, 4), torch.ones(1, 4))
        assert len(standin_events(log, "weight_copy")) == 1


def test_a_short_lone_request_answers_like_eager(tmp_path, minilm_dir):
    """A batch-1 bucket traced on a row that filled it lost its attention mask under
    XLA-like tracing (transformers skips an all-ones mask when not tracing), so a short
    lone request attended to its padding: cosine 0.82 to eager on MiniLM. Every bucket is
    now traced on a padded example."""
    from helpers import cosine, reference_embeddings

    from neuronserve.runtime import Runner

    texts = ["hi", "a short one", "what a wonderful day it is"]
    with standin_process(4):
        compile_model(
            load_spec(
                None,
                {
                    "model": minilm_dir,
                    "artifact": tmp_path / "m",
                    "target": "neuronx",
                    "precision": "fp32",
                    "batch_sizes": [1],
                    "sequence_lengths": [16],
                },
            ),
            progress=False,
        )
        runner = Runner(tmp_path / "m")
        got = [runner.responses_for_bodies([({"inputs": t}, None)])[0] for t in texts]
    for g, want, t in zip(got, reference_embeddings(minilm_dir, texts), texts, strict=True):
        assert cosine(g, want) >= 0.9999, t


def test_reference_batches_hold_padding(neuronx_artifact):
    from neuronserve.compile.reference import REFERENCE_FILE, Reference

    reference = Reference.load(neuronx_artifact / REFERENCE_FILE)
    for key, sets in reference.inputs.items():
        assert (sets[0]["attention_mask"] == 0).any(), key  # the compile example is padded
    assert len(reference.inputs["b1_s16"]) == 2  # batch 1: a padded row and a full one
    assert reference.inputs["b1_s16"][1]["attention_mask"].all()


def test_a_two_core_worker_keeps_a_copy_per_core_and_uses_both(neuronx_artifact, log):
    from neuronserve.runtime import Runner

    with standin_process(4, log=log), cores.neuron_pinned((2, 3)):
        runner = Runner(neuronx_artifact, cores=2)
        warmed = len(standin_events(log, "execute"))
        runner.responses_for_bodies([({"inputs": [f"text {i}" for i in range(8)]}, None)])
    loads = standin_events(log, "load")
    assert sorted({e["core"] for e in loads}) == [2, 3]
    assert len(loads) == 2 * len(read_manifest(neuronx_artifact).modules)
    # the batch of 8 split over both (into the buckets its measured times make cheapest)
    served = standin_events(log, "execute")[warmed:]
    assert {e["core"] for e in served} == {2, 3}


# --- cores: containers, contiguity, compile leases one ---------------------------------


def test_discovery_takes_what_the_container_was_given(monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "2,3")  # the device plugin's list
    assert cores.discover_neuron_cores(8) == [2, 3]  # even over an explicit count
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES")
    monkeypatch.delenv(cores.NEURON_CORES_ENV, raising=False)
    for k, v in standin_env(8, granted="4-7").items():
        monkeypatch.setenv(k, v)
    assert cores.discover_neuron_cores() == [4, 5, 6, 7]  # neuron-ls neuroncore_ids
    assert [g.label for g in placement.groups("neuron", 2)] == ["4-5", "6-7"]


def test_groups_never_span_a_gap(monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0,1,4,5,6")
    assert [g.label for g in placement.groups("neuron", 2)] == ["0-1", "4-5"]
    with pytest.raises(cores.NoFreeCoreGroup, match="in a contiguous range"):
        placement.groups("neuron", 4)
    with pytest.raises(cores.NoFreeCoreGroup, match="not a contiguous range"):
        cores.pin_neuron((1, 3))


def test_trn2_counts_logical_cores(monkeypatch):
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    assert cores._cores_per_device("trn2") == 4
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert cores._cores_per_device("trn2") == 8


_WORKER = """
import json, sys
from neuronserve.worker import ModelSettings, WorkerSettings, start_worker
models = [ModelSettings(name=n, artifact=n) for n in sys.argv[2:]]
settings = WorkerSettings(target="neuronx", core_kind="neuron", models=models)
w = start_worker(settings, sys.argv[1], owner="t")
print(json.dumps(list(w.lease.cores)), flush=True)
sys.stdin.readline()
"""


def test_workers_in_a_container_pin_inside_its_grant(tmp_path, neuronx_artifact, log):
    """Two workers in a container given cores 2-3 of an 8-core host: each pins one of them,
    and the runtime (which refuses cores the container was not given) accepts both."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "artifact").symlink_to(neuronx_artifact)
    env = {
        **os.environ,
        **standin_env(8, granted="2-3", log=log, devices=tmp_path / "devices"),
        "NEURON_RT_VISIBLE_CORES": "2,3",
        "NEURONSERVE_LEASE_DIR": str(tmp_path / "l"),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(model_dir), "artifact"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        leased = sorted(json.loads(p.stdout.readline())[0] for p in procs)
    finally:
        for p in procs:
            p.communicate("\n", timeout=60)
    assert leased == [2, 3]
    assert sorted(e["cores"] for e in standin_events(log, "runtime_init")) == [[2], [3]]


def test_a_core_another_live_process_holds_cannot_be_loaded_and_one_process_holds_many_models(
    tmp_path, neuronx_artifact, log
):
    """The runtime reserves a process's NeuronCores until it ends: a second process on the
    same core fails at its first load even without neuronserve's leases (here each has a
    lease folder of its own), while one process loads several models onto its core."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name in ("a", "b"):
        (model_dir / name).symlink_to(neuronx_artifact)
    base = {**os.environ, **standin_env(2, log=log, devices=tmp_path / "devices")}

    def load_alone(env: dict) -> subprocess.CompletedProcess:
        """A worker process loading model a, then ending."""
        return subprocess.run(
            [sys.executable, "-c", _WORKER, str(model_dir), "a"],
            env=env,
            input="\n",
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(model_dir), "a", "b"],
        env={**base, "NEURONSERVE_LEASE_DIR": str(tmp_path / "l1"), "NEURONSERVE_CORES": "0"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert json.loads(first.stdout.readline()) == [0]
        loads = [e for e in standin_events(log, "load") if e["pid"] == first.pid]
        # both models, every bucket, on the one core this process holds
        assert {e["core"] for e in loads} == {0} and len(loads) == 2 * 4
        second = load_alone({**base, "NEURONSERVE_LEASE_DIR": str(tmp_path / "l2")})
        assert second.returncode != 0
        assert "NeuronCore 0 is reserved by another process" in second.stderr
        assert f"pid {first.pid}" in second.stderr
    finally:
        first.communicate("\n", timeout=60)
    # gone with its process: the core is free again
    again = load_alone({**base, "NEURONSERVE_LEASE_DIR": str(tmp_path / "l3")})
    assert again.returncode == 0, again.stderr


def test_compile_leases_one_core_and_refuses_when_none_is_free(
    tmp_path, classifier_dir, log, monkeypatch
):
    monkeypatch.setenv("NEURONSERVE_LEASE_DIR", str(tmp_path / "leases"))
    with standin_process(2, log=log):
        compile_model(
            spec(
                tmp_path, classifier_dir, precision="fp32", batch_sizes=[1], sequence_lengths=[16]
            ),
            progress=False,
        )
        [init] = standin_events(log, "runtime_init")
        assert len(init["cores"]) == 1  # one core, not the host
        assert "NEURON_RT_VISIBLE_CORES" not in os.environ  # given back afterwards
        held = [placement.claim("neuron", 1, owner="a worker") for _ in range(2)]
        try:
            with pytest.raises(CompileError, match="no NeuronCore free"):
                compile_model(
                    spec(
                        tmp_path / "b",
                        classifier_dir,
                        precision="fp32",
                        batch_sizes=[1],
                        sequence_lengths=[16],
                    ),
                    progress=False,
                )
        finally:
            for lease in held:
                lease.release()


# --- Inf1: memory, pipeline cores, workdir, no NEURONCORE_GROUP_SIZES -------------------


def test_inf1_device_memory_is_checked_at_packaging(tmp_path, classifier_dir):
    problem = placement.device_memory_problem("neuron", 12, 220_000_000)
    assert "need 2.5 GiB per NeuronCore" in problem and "compile at most 7 bucket(s)" in problem
    assert placement.device_memory_problem("neuron", 12, 220_000_000, cores_per_module=4) is None
    assert placement.device_memory_problem("neuronx", 12, 220_000_000) is None  # 16 GiB/core
    assert placement.device_memory_problem("cpu", 12, 10**12) is None


def test_packaging_refuses_an_inf1_plan_that_cannot_fit(tmp_path, classifier_dir):
    from neuronserve.artifact import write_manifest
    from neuronserve.packaging.model import PackagingError, prepare

    with standin_process(0):
        compile_model(spec(tmp_path, classifier_dir, target="neuron"), progress=False)
    m = read_manifest(tmp_path / "art")
    # what BERT-base's bf16 weights would weigh, in each of the 4 bucket NEFFs
    m.compiler["weight_bytes"] = 600_000_000
    write_manifest(tmp_path / "art", m)
    with pytest.raises(PackagingError, match="compile at most 2 bucket"):
        prepare(load_spec(None, {"artifact": tmp_path / "art", "workers": 4}))


def test_cast_flags_in_compiler_args_are_refused():
    with pytest.raises(ValueError, match="--auto-cast in compiler_args"):
        neuronx.compiler_args({"precision": "fp32", "compiler_args": ["--auto-cast", "all"]})
    with pytest.raises(ValueError, match="--fast-math in compiler_args"):
        inf1.compiler_args({"compiler_args": ["--fast-math", "none"]})


def test_pipeline_auto_is_capped_at_the_host(tmp_path):
    class Weights(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(n))

    bert_base = Weights(109_500_000)  # BERT-base
    assert inf1.default_pipeline_cores(bert_base) == 20  # the rule of thumb alone
    assert inf1.default_pipeline_cores(bert_base, host_cores=16) == 16
    assert inf1.default_pipeline_cores(bert_base, host_cores=4) == 4
    assert inf1.default_pipeline_cores(Weights(1_000)) == 1
    assert inf1.compiler_args({"pipeline_cores": "auto", "neuron_cores": 16}, bert_base)[-1] == "16"


def test_inf1_trace_gets_the_workdir_and_no_group_sizes(tmp_path, classifier_dir, log):
    with standin_process(4, log=log):
        compile_model(
            spec(
                tmp_path,
                classifier_dir,
                target="neuron",
                batch_sizes=[1],
                sequence_lengths=[16],
                compiler_workdir=tmp_path / "wd",
                pipeline_cores=2,
            ),
            progress=False,
        )
    [trace] = standin_events(log, "trace")
    assert trace["compiler_workdir"].startswith(str(tmp_path / "wd"))
    m = read_manifest(tmp_path / "art")
    assert m.compiler["cores_per_module"] == 2
    assert all(e["env"]["NEURONCORE_GROUP_SIZES"] is None for e in standin_events(log))


# --- install, the stand-in itself, doctor ----------------------------------------------


def test_inf1_environment_is_installable():
    from configparser import ConfigParser

    cfg = ConfigParser()
    cfg.read(REPO / "setup.cfg")
    requires = cfg["options"]["install_requires"].split()
    assert not [r for r in requires if r.startswith("torch")]  # the extras pick the torch
    neuron = cfg["options.extras_require"]["neuron"]
    assert "torch-neuron" in neuron and "transformers>=4.40,<4.48" in neuron


TORCH_2_ONLY = (
    "torch.compile",
    "torch.compiler",
    "torch.export",
    "torch.func",
    "torch.library.custom_op",
    "scaled_dot_product_attention",
    "torch.nn.attention",
)


def test_inf1_code_paths_use_no_torch_2_api():
    """torch-neuron supports torch up to 1.13.1: what the Inf1 target runs (compile, the
    Runner, the worker) must not reach for an API torch 2 added."""
    paths = [
        *(REPO / "neuronserve").glob("*.py"),
        *(REPO / "neuronserve/compile").glob("*.py"),
        *(REPO / "neuronserve/tasks").glob("*.py"),
    ]
    found = [
        f"{p.name}: {api}"
        for p in paths
        for api in TORCH_2_ONLY
        if api in p.read_text() and p.name not in ("ort.py", "cpu.py")
    ]
    assert not found, found


def test_the_standin_refuses_what_the_runtime_refuses(tmp_path):
    code = (
        "import torch, torch_neuronx\n"
        "torch_neuronx.trace(torch.nn.Linear(2, 2), torch.ones(1, 2))\n"
    )
    for env, needle in (
        (standin_env(0), "no Neuron device found"),
        (
            {**standin_env(8, granted="2-3"), "NEURON_RT_VISIBLE_CORES": "0"},
            "names NeuronCores [0] this container was not given",
        ),
        (
            {**standin_env(4), "NEURON_RT_VISIBLE_CORES": "0,2"},
            "not a single core or a contiguous range",
        ),
    ):
        proc = subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True
        )
        assert proc.returncode != 0 and needle in proc.stderr, proc.stderr[-500:]


def test_the_standin_traces_like_xla(log):
    """torch.jit.is_tracing() is False inside its trace, so branches follow the example."""
    seen = []

    class Branchy(torch.nn.Module):
        def forward(self, a, b):
            seen.append(torch.jit.is_tracing())
            return a.float() * (2.0 if bool((b == 1).all()) else 3.0)

    with standin_process(4, log=log):
        import torch_neuronx

        traced = torch_neuronx.trace(Branchy(), (torch.ones(1, 2), torch.ones(1, 2)))
        assert seen == [False]
        # the branch taken for the all-ones example is baked in
        assert traced(torch.ones(1, 2), torch.zeros(1, 2)).tolist() == [[2.0, 2.0]]


def test_doctor_on_a_fake_host(tmp_path, neuronx_artifact):
    env = {
        **os.environ,
        **standin_env(4, log=tmp_path / "log.jsonl"),
        "NEURONSERVE_LEASE_DIR": str(tmp_path / "leases"),
    }
    out = run_cli("doctor", neuronx_artifact, env=env, check=False)
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stdout + out.stderr
    # the memory plan first: on 4 fake inf2 NeuronCores of 16 GiB, the tiny model fits
    assert lines[0].startswith("PASS  memory plan: fits") and "per NeuronCore" in out.stdout
    for check in (
        "NeuronCores",
        "runtime uses only the leased core",
        "padded batch-1 answers match CPU eager",
        "per-bucket model latency",
    ):
        assert any(line.startswith("PASS") and check in line for line in lines), (check, lines)
    no_device = run_cli(
        "doctor", neuronx_artifact, check=False, env={**os.environ, **standin_env(0)}
    )
    assert no_device.returncode == 1
    assert any(line.startswith("FAIL  NeuronCores") for line in no_device.stdout.splitlines())


def test_missing_sdk_gives_the_install_command(tmp_path, classifier_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import fails like a missing SDK
    monkeypatch.setenv(cores.NEURON_CORES_ENV, "2")  # a Neuron host without the SDK
    with pytest.raises(CompileError, match=r"pip install 'neuronserve\[neuronx\]'"):
        compile_model(spec(tmp_path, classifier_dir, precision="fp32"), progress=False)


def test_neuron_options_refused_for_cpu():
    from neuronserve.spec import SpecError

    with pytest.raises(SpecError, match="auto_cast apply to the Neuron targets"):
        load_spec(None, {"target": "cpu", "auto_cast": "all"})


def test_standin_is_only_on_the_tests_path():
    assert str(STANDIN) not in sys.path and Path(STANDIN, "bin", "neuron-ls").is_file()
