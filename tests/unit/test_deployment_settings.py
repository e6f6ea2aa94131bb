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

from neuronserve.packaging.triton import read_config
from neuronserve.serve.model_source import find_models
from neuronserve.spec import SpecError, from_environment, load_spec
from neuronserve.worker import WorkerSettings


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, classifier_dir):
    """The tiny classifier compiled with truncation off (by the CLI) and by default."""
    from helpers import compile_model
    from typer.testing import CliRunner

    from neuronserve.cli import app

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
    ctx = package_sagemaker(spec, "cpu", tmp_path / "sm")
    # what the SageMaker entrypoint finds in /opt/ml/model, and packages again with
    [found] = find_models(ctx / "model", tmp_path / "work")
    assert found.name == "strict" and found.truncation is want
    # a store of either server mounted there is read back the same way
    for store in (tmp_path / "store", tmp_path / "repo"):
        [found] = find_models(store, tmp_path / f"work-{store.name}")
        assert found.name == "strict" and found.truncation is want, store


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


def test_serving_through_triton_or_torchserve_is_refused_saying_what_to_run(
    tmp_path, tiny_artifact
):
    """neuronserve serves on its own workers only: the command, the flag, a spec file
    and the containers' variable that asked for Triton or TorchServe are refused in one
    line naming the package command and the server's own start; nothing is made."""
    triton = "neuronserve package triton ARTIFACT --repository REPO, then tritonserver"
    torchserve = "torchserve --start --model-store STORE --ts-config STORE/config.properties"
    for command, said in (("triton", triton), ("torchserve", torchserve)):
        r = cli("serve", command, "--repository", "x", cwd=tmp_path, check=False)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.splitlines()) == 1
        r = cli("serve", "front", str(tiny_artifact), "--engine", command, cwd=tmp_path,
                check=False)  # fmt: skip
        assert r.returncode != 0 and said in r.stderr, r.stderr
        r = cli("package", "sagemaker", str(tiny_artifact), "--engine", command, "--out",
                tmp_path / "ctx", cwd=tmp_path, check=False)  # fmt: skip
        assert r.returncode == 2 and said in r.stderr, r.stderr
    (tmp_path / "deploy.yaml").write_text("front:\n  engine: torchserve\n")
    with pytest.raises(ValueError, match="to serve with torchserve, run: neuronserve package"):
        load_spec(tmp_path / "deploy.yaml")
    with pytest.raises(SpecError, match=r"NEURONSERVE_ENGINE=.triton.*tritonserver"):
        from_environment({"NEURONSERVE_ENGINE": "triton"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy.yaml"]
    # the one server's own name, as earlier specs wrote it, still loads
    assert load_spec(None, {"front": {"engine": "native"}}).front.engine is None
