from pathlib import Path

import pytest

from neuronserve.spec import SpecError, load_spec


def test_yaml_spec_with_flag_overrides(tmp_path):
    f = tmp_path / "deploy.yaml"
    f.write_text("model: models/minilm\nbatch-sizes: [8, 1, 4, 4]\ntruncation: false\n"
                 "workers: 2\nartifact: out/minilm\n")
    spec = load_spec(f, {"workers": 1, "truncation": None})
    assert spec.batch_sizes == [1, 4, 8]  # sorted, deduplicated
    assert spec.workers == 1  # the flag wins
    assert spec.truncation is False  # an unset flag does not override the file
    assert spec.model == tmp_path / "models/minilm"  # relative to the spec file
    assert spec.model_name() == "minilm"


@pytest.mark.parametrize("text,needle", [
    ("batch_sizes: [0, 4]\n", "batch_sizes"),
    ("sequence_lengths: [2]\n", "at least 4"),
    ("task: translation\n", "task"),
    ("cores_per_worker: 0\n", "cores_per_worker"),
    ("worker: 2\n", "worker"),  # typo of a field name is an error, not ignored
    ("- a list\n", "mapping"),
])
def test_bad_specs_name_the_field(tmp_path, text, needle):
    f = tmp_path / "deploy.yaml"
    f.write_text(text)
    with pytest.raises(SpecError, match=needle):
        load_spec(f)


def test_missing_spec_file_is_clear():
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(Path("/nonexistent/deploy.yaml"))


def test_layouts_turn_into_workers_and_cores(tmp_path, minilm_artifact):
    from neuronserve.artifact import read_manifest
    from neuronserve.cores import discover
    from neuronserve.packaging.torchserve import _plan_workers, apply_layout, model_config
    from neuronserve.packaging.triton import package_triton, read_config

    manifest = read_manifest(minilm_artifact)
    n = len(discover("cpu"))
    latency = apply_layout(load_spec(None, {"layout": "latency", "batch_requests": 2}), manifest)
    workers, _ = _plan_workers(latency, manifest)
    cfg = model_config(latency, manifest, workers)
    assert (cfg["minWorkers"], cfg["neuronserve"]["cores_per_worker"]) == (1, n)
    assert cfg["batchSize"] == 2
    throughput = apply_layout(load_spec(None, {}), manifest)
    workers, _ = _plan_workers(throughput, manifest)
    cfg = model_config(throughput, manifest, workers)
    assert (cfg["minWorkers"], cfg["neuronserve"]["cores_per_worker"]) == (n, 1)
    assert cfg["batchSize"] == manifest.grid.max_batch
    # Triton: one instance holding every core
    spec = load_spec(None, {"layout": "latency", "triton_repository": tmp_path / "repo"})
    config = read_config(package_triton(minilm_artifact, spec) / "config.pbtxt")
    assert config.instance_group[0].count == 1
    assert config.parameters["neuronserve_cores_per_instance"].string_value == str(n)
    with pytest.raises(SpecError, match="layout latency runs one worker"):
        load_spec(None, {"layout": "latency", "workers": 2})
