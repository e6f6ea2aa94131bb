from pathlib import Path

import pytest

from neuronserve.spec import SpecError, load_spec


def test_yaml_spec_with_flag_overrides(tmp_path):
    f = tmp_path / "deploy.yaml"
    f.write_text(
        "model: models/minilm\nbatch-sizes: [8, 1, 4, 4]\ntruncation: false\n"
        "workers: 2\nartifact: out/minilm\n"
    )
    spec = load_spec(f, {"workers": 1, "truncation": None})
    assert spec.batch_sizes == [1, 4, 8]  # sorted, deduplicated
    assert spec.workers == 1  # the flag wins
    assert spec.truncation is False  # an unset flag does not override the file
    assert spec.model == tmp_path / "models/minilm"  # relative to the spec file
    assert spec.model_name() == "minilm"


@pytest.mark.parametrize(
    "text,needle",
    [
        ("batch_sizes: [0, 4]\n", "batch_sizes"),
        ("sequence_lengths: [2]\n", "at least 4"),
        ("task: translation\n", "task"),
        ("cores_per_worker: 0\n", "cores_per_worker"),
        ("worker: 2\n", "worker"),  # typo of a field name is an error, not ignored
        ("- a list\n", "mapping"),
    ],
)
def test_bad_specs_name_the_field(tmp_path, text, needle):
    f = tmp_path / "deploy.yaml"
    f.write_text(text)
    with pytest.raises(SpecError, match=needle):
        load_spec(f)


def test_missing_spec_file_is_clear():
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(Path("/nonexistent/deploy.yaml"))


def test_latency_layout_refuses_explicit_workers():
    with pytest.raises(SpecError, match="layout latency runs one worker"):
        load_spec(None, {"layout": "latency", "workers": 2})


def test_every_field_has_a_description_for_the_cli():
    from neuronserve.spec import DeploySpec

    assert [k for k, f in DeploySpec.model_fields.items() if not f.description] == []
