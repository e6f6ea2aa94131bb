"""Several models in one deployment, before anything starts: what `package` writes for
TorchServe and Triton (one engine model whose workers hold every model), what it refuses
(two models of one name, artifacts for different targets, a plan whose workers cannot
hold them all in memory), and how the spec names them."""

from __future__ import annotations

import zipfile

import pytest
import yaml
from helpers import package_for
from typer.testing import CliRunner

from neuronserve import placement
from neuronserve.cli import app
from neuronserve.packaging.model import PackagingError, prepare
from neuronserve.packaging.triton import read_config
from neuronserve.spec import SpecError, load_spec
from neuronserve.worker import WorkerSettings


def spec(tmp_path, *artifacts, **fields):
    return load_spec(
        None,
        {
            "models": [{"artifact": a} for a in artifacts],
            "model_store": tmp_path / "store",
            "triton_repository": tmp_path / "repo",
            "workers": 2,
            **fields,
        },
    )


def test_torchserve_gets_one_archive_holding_every_model(
    tmp_path, tiny_artifact, classifier_artifact
):
    out = CliRunner().invoke(
        app,
        ["package", "torchserve", str(tiny_artifact), str(classifier_artifact),
         "--model-store", str(tmp_path / "store"), "--workers", "2", "--deployment-name", "rag"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert (
        "rag.mar" in out.output and "2 models" in out.output and "X-Neuronserve-Model" in out.output
    )
    # it says what it wrote, the archive and the properties TorchServe starts with
    store = (tmp_path / "store").resolve()
    for written in (store / "rag.mar", store / "config.properties"):
        assert f"wrote {written}" in out.output and written.is_file(), out.output
    with zipfile.ZipFile(tmp_path / "store" / "rag.mar") as z:
        names = z.namelist()
        config = yaml.safe_load(z.read("model-config.yaml"))
    assert any(n.startswith("models/tiny/") for n in names)
    assert any(n.startswith("models/tiny-classifier/") for n in names)
    # one TorchServe model: its two workers each load both models
    assert config["minWorkers"] == config["maxWorkers"] == 2
    settings = WorkerSettings.from_section(config)
    assert [(m.name, m.artifact) for m in settings.models] == [
        ("tiny", "models/tiny"),
        ("tiny-classifier", "models/tiny-classifier"),
    ]
    assert [p.name for p in (tmp_path / "store").glob("*.mar")] == ["rag.mar"]


def test_triton_gets_one_model_taking_what_every_model_takes(
    tmp_path, tiny_artifact, classifier_artifact
):

    model_dir = package_for("triton", spec(tmp_path, tiny_artifact, classifier_artifact))
    assert model_dir.name == "models"  # the default deployment name
    config = read_config(model_dir / "config.pbtxt")
    inputs = {i.name: i.optional for i in config.input}
    # TEXT carries every model's texts; TEXT_PAIR only the classifier's pairs
    assert inputs == {"TEXT": False, "TEXT_PAIR": True}
    outputs = {o.name: list(o.dims) for o in config.output}
    assert outputs["EMBEDDING"] == [32] and outputs["SCORES"] == [3]
    # one group per core group, each its own host policy (its cores)
    groups = [(g.name, g.count, g.host_policy) for g in config.instance_group]
    assert groups == [("cores0", 1, "cores0"), ("cores1", 1, "cores1")]
    assert (model_dir / "1" / "models" / "tiny" / "manifest.json").is_file()
    assert (model_dir / "1" / "models" / "tiny-classifier" / "manifest.json").is_file()


def test_two_embedders_of_other_widths_share_a_variable_output(tmp_path, tiny_artifact, minilm_dir):
    from helpers import compile_artifact, tiny_model

    wider = compile_artifact(
        tmp_path / "wider",
        tiny_model(tmp_path / "m", minilm_dir, "feature-extraction", hidden_size=48),
        "feature-extraction",
        module_format="torchscript",
    )
    packaged = prepare(spec(tmp_path, tiny_artifact, wider))
    from neuronserve.packaging.triton import model_config

    outputs = {o.name: list(o.dims) for o in model_config(packaged).output}
    # (every token's vector travels as bytes, one element per text, whatever the width)
    assert outputs == {"EMBEDDING": [-1], "TOKEN_EMBEDDINGS": [1], "TOKENS": [1]}


def test_two_models_of_one_name_and_two_targets_are_refused(
    tmp_path, tiny_artifact, neuronx_manifest_artifact
):
    with pytest.raises(PackagingError, match="two models are named 'tiny'"):
        prepare(spec(tmp_path, tiny_artifact, tiny_artifact))
    with pytest.raises(
        PackagingError, match=r"different targets \(tiny: cpu, tiny-neuronx: neuronx\)"
    ):
        prepare(spec(tmp_path, tiny_artifact, neuronx_manifest_artifact, workers=1))
    renamed = load_spec(
        None,
        {
            "models": [{"artifact": tiny_artifact}, {"artifact": tiny_artifact, "name": "again"}],
            "workers": 1,
        },
    )
    assert [m.name for m in prepare(renamed).models] == ["tiny", "again"]


def test_memory_is_planned_before_anything_starts(
    tmp_path, tiny_artifact, classifier_artifact, monkeypatch
):
    packaged = prepare(spec(tmp_path, tiny_artifact, classifier_artifact))
    memory = packaged.memory
    assert memory.fits and [m.name for m in memory.models] == ["tiny", "tiny-classifier"]
    assert all(m.weights > 0 and m.activations > 0 for m in memory.models)
    # every worker holds every model: the need is the sum of weights, not one model's
    assert memory.need == memory.overhead + sum(m.weights for m in memory.models) + max(
        m.activations for m in memory.models
    )
    # a host whose memory each worker would overrun: refused, with the numbers and the fix
    monkeypatch.setattr(placement, "_host_memory", lambda: placement.HOST_RESERVE + 2 * 300 * 2**20)
    with pytest.raises(PackagingError) as refused:
        prepare(spec(tmp_path, tiny_artifact, classifier_artifact))
    message = str(refused.value)
    assert (
        "do not fit" in message
        and "tiny: weights" in message
        and "MiB needed of 300 MiB" in message
    )
    assert "Serve fewer models together" in message and "run fewer workers" in message


def test_the_spec_names_several_models_with_paths_relative_to_it(tmp_path, tiny_artifact):
    (tmp_path / "deploy.yaml").write_text(
        yaml.safe_dump(
            {"models": [{"artifact": "a"}, {"artifact": str(tiny_artifact), "truncation": True}]}
        )
    )
    s = load_spec(tmp_path / "deploy.yaml")
    assert [e.artifact for e in s.model_entries()] == [tmp_path / "a", tiny_artifact]
    assert s.model_entries()[1].truncation is True
    # artifacts given on the command line replace the file's
    assert (
        load_spec(tmp_path / "deploy.yaml", {"artifact": tiny_artifact}).model_entries()[0].artifact
        == tiny_artifact
    )
    with pytest.raises(SpecError, match="either `artifact`"):
        load_spec(None, {"artifact": "x", "models": [{"artifact": "y"}]})
    with pytest.raises(SpecError, match="each entry has its own `name`"):
        load_spec(None, {"name": "x", "models": [{"artifact": "y"}]})


def test_more_workers_than_core_groups_is_warned_at_packaging(tmp_path, tiny_artifact, capsys):
    import os

    groups = len(os.sched_getaffinity(0))
    prepare(spec(tmp_path, tiny_artifact, workers=groups + 1))
    assert f"workers beyond {groups} will fail to start" in capsys.readouterr().err
