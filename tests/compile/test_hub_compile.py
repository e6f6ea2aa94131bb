"""From a model id to an artifact, compiled: the compiled-artifact cache keyed by what
decides the artifact (a second start compiles nothing; a changed compile field or an
altered artifact does), a spec's models by Hub id made artifacts, and `compile --model`
with a Hub id, offline against a pre-filled Hugging Face cache."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from helpers import HUB_TEST_ID as REPO_ID
from helpers import run_cli

from neuronserve.compile import CompileError
from neuronserve.compile import cache as artifact_cache
from neuronserve.compile.job import CompileJob
from neuronserve.spec import load_spec

GRID = {"batch_sizes": [1, 4], "sequence_lengths": [16, 32], "precision": "fp32"}


def _job(**compile_fields) -> CompileJob:
    spec = load_spec(None, {"compile": {"model": REPO_ID, **GRID, **compile_fields}})
    return CompileJob.of(spec)


def test_the_second_start_reuses_the_artifact_and_a_changed_field_compiles_again(
    offline_hub, monkeypatch
):
    said: list[str] = []
    first = artifact_cache.compiled(_job(), said.append, progress=False)
    assert (first / "manifest.json").is_file() and first.name == "tiny-embedder"
    assert "compiling for feature-extraction on cpu" in said[-1]
    root = Path(os.environ["NEURONSERVE_CACHE"]) / "artifacts"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700  # the workers run what is kept here

    def no_compile(*_a, **_k):
        raise AssertionError("compiled again")

    import neuronserve.compile.driver as driver

    with monkeypatch.context() as m:
        m.setattr(driver, "compile_job", no_compile)
        assert artifact_cache.compiled(_job(), said.append, progress=False) == first
    assert "compiled before, from the cache" in said[-1]
    other = artifact_cache.compiled(_job(batch_sizes=[1, 2]), said.append, progress=False)
    assert other != first and "compiling" in said[-1]
    # an artifact altered in the cache is not served: compiled again
    (first / "config.json").write_text("{}")
    assert artifact_cache.compiled(_job(), said.append, progress=False) == first
    assert "compiling" in said[-1]


def test_a_spec_naming_models_gets_their_artifacts(offline_hub):
    spec = load_spec(
        None,
        {
            "compile": GRID,
            "models": [
                {"model": REPO_ID},
                {"model": REPO_ID, "name": "second", "task": "fill-mask"},
            ],
        },
    )
    said: list[str] = []
    done = artifact_cache.resolved(spec, said.append, progress=False)
    entries = done.model_entries()
    assert [e.name for e in entries] == ["tiny-embedder", "second"]
    assert all((e.artifact / "manifest.json").is_file() for e in entries)
    assert done.model_sources() == []
    one = artifact_cache.resolved(
        load_spec(None, {"compile": {"model": REPO_ID, **GRID}}), said.append, progress=False
    )
    assert one.model_name() == "tiny-embedder" and one.artifact is not None


def test_compile_takes_a_hub_id_and_says_when_given_an_artifact(offline_hub, tmp_path):
    env = {**os.environ}
    out = tmp_path / "art"
    args = ["--batch-sizes", "1", "--sequence-lengths", "16", "--precision", "fp32"]
    done = run_cli("compile", "--model", REPO_ID, "--out", out, *args, env=env)
    assert "artifact written to" in done.stdout
    again = run_cli("compile", "--model", out, "--out", tmp_path / "b", *args, check=False, env=env)
    assert again.returncode == 1 and "is a neuronserve artifact" in again.stderr
    missing = run_cli(
        "compile", "--model", "./no-such-folder", "--out", tmp_path / "c", check=False, env=env
    )
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_the_containers_entrypoint_serves_hf_model_id(offline_hub, tmp_path, monkeypatch):
    """SageMaker's (and the Kubernetes pod's) environment names the model as Hugging
    Face's containers do: HF_MODEL_ID, HF_MODEL_REVISION, HF_TASK."""
    from neuronserve.platforms.sagemaker import entrypoint as sagemaker

    monkeypatch.setenv("HF_MODEL_ID", REPO_ID)
    monkeypatch.setenv("HF_TASK", "fill-mask")
    monkeypatch.delenv("NEURONSERVE_MODEL_DIR", raising=False)
    spec = sagemaker.sagemaker_spec(tmp_path / "work")
    assert [(s.model, s.task) for s in spec.model_sources()] == [(REPO_ID, "fill-mask")]
    deployment = sagemaker.sagemaker_deployment(spec, tmp_path / "work")
    assert {m.name: m.manifest.task for m in deployment.packaged.models} == {
        "tiny-embedder": "fill-mask"
    }
    monkeypatch.setenv("HF_MODEL_ID", "neuronserve-tests/absent")
    with pytest.raises(CompileError, match="not in the Hugging Face cache"):
        sagemaker.sagemaker_deployment(sagemaker.sagemaker_spec(tmp_path / "w2"), tmp_path / "w2")


def test_the_containers_entrypoint_compiles_model_data_that_is_a_model_folder(
    tmp_path, monkeypatch, tiny_embedder_dir
):
    """The Hugging Face toolkit's model.tar.gz holds a model folder at its root: compiled
    when the container starts, to the Neuron container's HF_OPTIMUM_* shape as its
    largest bucket."""
    import shutil

    from neuronserve.platforms.sagemaker import entrypoint as sagemaker

    for var in ("HF_MODEL_ID", "SAGEMAKER_MULTI_MODEL", "HF_TASK"):
        monkeypatch.delenv(var, raising=False)
    data = tmp_path / "opt-ml-model"
    shutil.copytree(tiny_embedder_dir, data)
    monkeypatch.setenv("NEURONSERVE_MODEL_DIR", str(data))
    monkeypatch.setenv("HF_OPTIMUM_BATCH_SIZE", "2")
    monkeypatch.setenv("HF_OPTIMUM_SEQUENCE_LENGTH", "24")
    monkeypatch.setenv("NEURONSERVE_CACHE", str(tmp_path / "cache"))
    spec = sagemaker.sagemaker_spec(tmp_path / "work")
    deployment = sagemaker.sagemaker_deployment(spec, tmp_path / "work")
    [manifest] = [m.manifest for m in deployment.packaged.models]
    assert manifest.task == "feature-extraction"
    assert manifest.grid.batch_sizes == (1, 2) and manifest.grid.sequence_lengths == (16, 24)


def test_a_neuron_section_in_a_models_config_is_its_largest_bucket(
    tmp_path, monkeypatch, tiny_embedder_dir
):
    """The Hugging Face toolkit (and optimum-neuron) compile the one shape a plain model's
    config.json names in its `neuron` section: here the grid's largest, said in the
    log; a grid the user names wins."""
    import json
    import shutil

    from neuronserve.artifact import read_manifest
    from neuronserve.compile.cache import resolved
    from neuronserve.spec import load_spec

    folder = tmp_path / "model"
    shutil.copytree(tiny_embedder_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["neuron"] = {"static_batch_size": 2, "static_sequence_length": 24}
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("NEURONSERVE_CACHE", str(tmp_path / "cache"))
    said: list[str] = []
    spec = resolved(load_spec(None, {"models": [{"model": str(folder)}]}), said.append, False)
    manifest = read_manifest(spec.artifact)
    assert manifest.grid.batch_sizes == (1, 2) and manifest.grid.sequence_lengths == (16, 24)
    assert any("static_sequence_length 24" in line for line in said), said
    mine = {"models": [{"model": str(folder)}], "compile": {"sequence_lengths": [16]}}
    manifest = read_manifest(resolved(load_spec(None, mine), said.append, False).artifact)
    assert manifest.grid.batch_sizes == (1, 2) and manifest.grid.sequence_lengths == (16,)


def test_packaging_a_spec_that_names_models_by_hub_id(offline_hub, tmp_path):
    """The spec's `models` by Hub id: `package` compiles them (for the package's target)
    into the cache first; a second package compiles nothing."""
    (tmp_path / "deploy.yaml").write_text(
        f"models: [{{model: {REPO_ID}}}]\n"
        "compile: {batch_sizes: [1, 4], sequence_lengths: [16, 32], precision: fp32}\n"
    )
    env = {**os.environ}
    first = run_cli(
        "package", "kubernetes", "--spec", "deploy.yaml", "--image", "r/x:1", "--out", "k8s",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert f"{REPO_ID}: compiling for feature-extraction on cpu" in first.stdout
    assert (tmp_path / "k8s" / "plain").is_dir()
    # the compiled model is baked into the image's context, under the Hub name's last part,
    # as the workers' store holds it
    assert (tmp_path / "k8s" / "image" / "model" / "tiny-embedder" / "native.json").is_file()
    again = run_cli("package", "triton", "--spec", "deploy.yaml", cwd=tmp_path, env=env)
    assert "compiled before, from the cache" in again.stdout
