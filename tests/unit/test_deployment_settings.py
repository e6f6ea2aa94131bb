"""A setting the artifact recorded (truncation, the model name) is what every engine is
packaged with unless it is given again at packaging time (neuronserve.packaging.model):
`package torchserve`, `package triton`, `package sagemaker` and the SageMaker entrypoint,
which packages again for its host from what it finds in /opt/ml/model."""

from __future__ import annotations

import json

import pytest
import yaml
from google.protobuf import json_format
from helpers import cli, package_for

from neuronserve.engines.triton.package import read_config
from neuronserve.serve.model_source import find_models
from neuronserve.spec import load_spec
from neuronserve.worker import WorkerSettings


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, classifier_dir):
    """The tiny classifier compiled with truncation off (by the CLI) and by default."""
    from typer.testing import CliRunner

    from neuronserve.cli import app
    from neuronserve.compile import compile_model

    work = tmp_path_factory.mktemp("settings")
    grid = {
        "task": "text-classification",
        "precision": "fp32",
        "module_format": "torchscript",
        "batch_sizes": [1],
        "sequence_lengths": [16],
    }
    flags = ["--task", "text-classification", "--precision", "fp32", "--module-format"]
    out = CliRunner().invoke(
        app,
        ["compile", "--model", str(classifier_dir), *flags, "torchscript", "--batch-sizes", "1",
         "--sequence-lengths", "16", "--no-truncation", "--out", str(work / "strict")],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    compile_model(
        load_spec(None, {"model": classifier_dir, "artifact": work / "default", **grid}),
        progress=False,
    )
    return work


def test_compile_records_truncation(artifacts):
    for name, want in (("strict", False), ("default", True)):
        manifest = json.loads((artifacts / name / "manifest.json").read_text())
        assert manifest["tokenizer"]["truncation"] is want, name


def torchserve_truncation(store, name):
    config = yaml.safe_load((store / name / "model-config.yaml").read_text())
    [model] = WorkerSettings.from_section(config).models
    return model.truncation


def triton_truncation(repo, name):
    config = json_format.MessageToDict(
        read_config(repo / name / "config.pbtxt"), preserving_proto_field_name=True
    )
    strings = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
    [model] = WorkerSettings.from_parameters(strings).models
    return model.truncation


@pytest.mark.parametrize("given", [None, True])
def test_packaging_keeps_the_artifacts_truncation_unless_given(artifacts, tmp_path, given):
    from neuronserve.platforms.sagemaker.context import package_sagemaker

    strict, want = artifacts / "strict", False if given is None else given
    # what `package ... [--truncation]` hands the packagers (cli/options.load)
    fields = {"artifact": strict, **({} if given is None else {"truncation": given})}
    spec = load_spec(
        None,
        {
            **fields,
            "worker": {"workers": 1},
            "torchserve": {"archive_format": "no-archive", "model_store": tmp_path / "store"},
            "triton": {"repository": tmp_path / "repo"},
        },
    )
    package_for("torchserve", spec)
    assert torchserve_truncation(tmp_path / "store", "strict") is want
    package_for("triton", spec)
    assert triton_truncation(tmp_path / "repo", "strict") is want
    for engine in ("torchserve", "triton"):
        ctx = package_sagemaker(spec, engine, "cpu", tmp_path / f"sm-{engine}")
        # what the SageMaker entrypoint finds in /opt/ml/model, and packages again with
        [found] = find_models(ctx / "model", tmp_path / f"work-{engine}")
        assert found.name == "strict" and found.truncation is want, engine


def test_the_flag_turns_a_default_artifact_strict(artifacts, tmp_path):
    cli(
        "package",
        "triton",
        artifacts / "default",
        "--repository",
        tmp_path / "repo",
        "--instances",
        "1",
    )
    assert triton_truncation(tmp_path / "repo", "default") is True
    cli(
        "package",
        "triton",
        artifacts / "default",
        "--repository",
        tmp_path / "repo",
        "--instances",
        "1",
        "--no-truncation",
    )
    assert triton_truncation(tmp_path / "repo", "default") is False
    # a bare artifact as /opt/ml/model carries no packaging-time settings
    [bare] = find_models(artifacts / "default", tmp_path)
    assert bare.truncation is None and bare.name == "default"


def test_help_says_the_flag_defaults_to_the_artifact():
    from typer.testing import CliRunner

    from neuronserve.cli import app

    for command in ("torchserve", "triton", "sagemaker"):
        out = CliRunner().invoke(app, ["package", command, "--help"], env={"COLUMNS": "200"})
        assert out.exit_code == 0 and "--truncation" in out.output, out.output
        assert "package: default what the artifact recorded" in out.output, command


def test_tritons_sagemaker_listener_is_refused_before_anything_starts(tmp_path):
    """Triton's SageMaker listener would bind 0.0.0.0 without a key: the spec is refused
    (in a file or as the flag), saying to use the front, and nothing is made."""
    r = cli("serve", "triton", "--sagemaker", "--run-dir", "run2", cwd=tmp_path, check=False)
    assert r.returncode == 2 and "serve front REPOSITORY --engine triton" in r.stderr
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "deploy.yaml").write_text("triton:\n  sagemaker: true\n")
    with pytest.raises(ValueError, match="Triton's own SageMaker listener"):
        load_spec(tmp_path / "deploy.yaml")
