from pathlib import Path

import pytest

from neuronserve.spec import SpecError, load_spec


def test_yaml_spec_with_flag_overrides(tmp_path):
    (tmp_path / "models/minilm").mkdir(parents=True)
    f = tmp_path / "deploy.yaml"
    f.write_text(
        "model: ./models/minilm\nbatch-sizes: [8, 1, 4, 4]\ntruncation: false\n"
        "workers: 2\nartifact: out/minilm\n"
    )
    spec = load_spec(f, {"workers": 1, "truncation": None})
    assert spec.compile.batch_sizes == [1, 4, 8]  # sorted, deduplicated
    assert spec.worker.workers == 1  # the flag wins
    assert spec.truncation is False  # an unset flag does not override the file
    assert spec.compile.model == str(tmp_path / "./models/minilm")  # relative to the spec file
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
    from neuronserve.spec import SECTIONS, DeploySpec

    models = [DeploySpec, *SECTIONS]
    sections = {s.key for s in SECTIONS}
    missing = [
        f"{m.__name__}.{k}"
        for m in models
        for k, f in m.model_fields.items()
        if not f.description and not (m is DeploySpec and k in sections)
    ]
    assert missing == []


def test_a_sectioned_spec_file_loads_and_each_consumer_reads_its_section(tmp_path, capsys):
    f = tmp_path / "deploy.yaml"
    f.write_text(
        "artifact: out/minilm\n"
        "compile: {batch_sizes: '1,8', model: ./models/minilm}\n"
        "worker: {workers: 2, max_queued: 7}\n"
        "limits: {max_client_batch: 64}\n"
        "front: {port: 4000, run_dir: front}\n"
        "triton: {repository: repo}\n"
    )
    spec = load_spec(f)
    assert spec.compile.batch_sizes == [1, 8] and spec.compile.model == str(
        tmp_path / "models/minilm"
    )
    assert (spec.worker.workers, spec.worker.max_queued, spec.limits.max_client_batch) == (2, 7, 64)
    assert spec.front.port == 4000 and spec.front.run_dir == tmp_path / "front"
    assert spec.triton.repository == tmp_path / "repo"
    assert capsys.readouterr().err == ""  # no note for a sectioned file
    # what a spec gives round-trips
    assert load_spec(None, spec.model_dump(exclude_unset=True)) == spec


def test_a_flat_spec_file_still_loads_and_says_where_each_field_went(tmp_path, capsys):
    f = tmp_path / "deploy.yaml"
    f.write_text(
        "artifact: out/minilm\nfront_port: 4000\nfront_run_dir: front\nworkers: 2\n"
        "max_body_bytes: 1000\ntriton_repository: repo\nmodel_store: store\n"
        "multi_model: true\nbind_address: 0.0.0.0\n"
    )
    spec = load_spec(f)
    assert spec.front.port == 4000 and spec.front.run_dir == tmp_path / "front"
    assert spec.worker.workers == 2 and spec.limits.max_body_bytes == 1000
    assert spec.multi_model.enabled
    assert spec.triton.repository == tmp_path / "repo"
    assert spec.torchserve.model_store == tmp_path / "store"
    assert spec.torchserve.bind_address == "0.0.0.0"
    note = capsys.readouterr().err
    assert "flat layout, which is deprecated" in note
    for moved in ("front_port -> front.port", "triton_repository -> triton.repository",
                  "multi_model -> multi_model.enabled", "workers -> worker.workers"):  # fmt: skip
        assert moved in note, moved


def test_every_option_is_a_field_declared_once_with_its_help():
    """The commands' options are generated from the sections' fields: each option's help
    is its field's description, and no command has an option twice."""
    import typer

    from neuronserve.cli import app
    from neuronserve.cli.spec_options import cli_fields, field_help
    from neuronserve.spec import SECTIONS

    described = {
        field_help(f) for part in ["", *(s.key for s in SECTIONS)] for _, f in cli_fields(part)
    }
    root = typer.main.get_command(app)
    seen_spec_options = 0
    groups = [root, *(c for c in root.commands.values() if hasattr(c, "commands"))]
    for group in groups:
        for command in group.commands.values():
            if hasattr(command, "commands"):
                continue
            flags = [o for p in command.params for o in p.opts + p.secondary_opts]
            assert len(flags) == len(set(flags)), (command.name, flags)
            for p in command.params:
                if p.name and "__" in p.name:  # generated from a field
                    seen_spec_options += 1
                    assert p.help in described, (command.name, p.name)
    assert seen_spec_options > 100


def test_a_model_is_a_folder_next_to_the_spec_or_a_hub_id(tmp_path):
    """Written as a path, a folder relative to the spec; shaped like a Hub id, the Hub's
    model even where a folder of that name lies beside the spec."""
    (tmp_path / "here").mkdir()
    (tmp_path / "org" / "name").mkdir(parents=True)
    f = tmp_path / "deploy.yaml"
    f.write_text(
        "compile: {model: org/name}\n"
        "models: [{model: ./here}, {model: ../there}, {model: sentence-transformers/x@v1}, "
        "{artifact: art}, {model: here}, {model: a/b/c}]\n"
    )
    spec = load_spec(f)
    assert spec.compile.model == "org/name"
    assert [getattr(m, "model", None) for m in spec.models] == [
        str(tmp_path / "./here"),
        str(tmp_path / "../there"),
        "sentence-transformers/x@v1",
        None,
        "here",
        str(tmp_path / "a/b/c"),  # no Hub id has two slashes
    ]
    assert [s.model for s in spec.model_sources()][2] == "sentence-transformers/x@v1"
    with pytest.raises(SpecError, match="Hub id or folder"):
        spec.model_entries()  # to be compiled first: only `serve front` does
    one = load_spec(None, {"compile": {"model": "org/name", "revision": "abc"}, "name": "n"})
    assert [(s.model, s.revision, s.name) for s in one.model_sources()] == [
        ("org/name", "abc", "n")
    ]
    assert (
        load_spec(None, {"compile": {"model": "org/name"}, "artifact": "a"}).model_sources() == []
    )


def test_the_models_given_replace_the_specs_own_and_nothing_else():
    """One artifact is the spec's `artifact` with its name and truncation; several, or
    models named by Hub id, its `models`; every other setting stays as given."""
    from neuronserve.spec import ModelEntry, ModelSource

    spec = load_spec(None, {"artifact": "a", "name": "old", "front_port": 9, "truncation": False})
    one = spec.with_models([ModelEntry(artifact=Path("c"), name="c1", truncation=True)])
    assert (one.artifact, one.name, one.models, one.truncation) == (Path("c"), "c1", [], True)
    assert one.front.port == 9
    unnamed = spec.with_models([ModelEntry(artifact=Path("c"))])
    assert (unnamed.name, unnamed.truncation) == (None, False)
    two = spec.with_models([ModelEntry(artifact=Path("d")), ModelEntry(artifact=Path("e"))])
    assert [m.artifact for m in two.model_entries()] == [Path("d"), Path("e")]
    assert two.artifact is None and two.name is None and two.front.port == 9
    hub = spec.with_models([ModelSource(model="org/m", name="m")])
    assert [(s.model, s.name) for s in hub.model_sources()] == [("org/m", "m")]
    assert hub.artifact is None and hub.front.port == 9
