"""From a model id to an artifact: Hub ids resolved offline against a pre-filled Hugging
Face cache, the task read from the config, and the compiled-artifact cache keyed by what
decides the artifact (a second start compiles nothing; a changed compile field does)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import HUB_TEST_ID as REPO_ID
from helpers import tiny_model

from neuronserve.compile import CompileError
from neuronserve.compile import cache as artifact_cache
from neuronserve.compile.hub import config_task, model_folder, split_revision
from neuronserve.compile.job import CompileJob
from neuronserve.spec import load_spec

GRID = {"batch_sizes": [1, 4], "sequence_lengths": [16, 32], "precision": "fp32"}


def test_a_hub_id_is_found_in_the_cache_offline_and_a_missing_one_says_what_to_do(offline_hub):
    found = model_folder(REPO_ID)
    assert found.repo_id == REPO_ID and found.revision == "1" * 40
    assert (found.folder / "config.json").is_file() and found.name == "tiny-embedder"
    with pytest.raises(CompileError, match=r"not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        model_folder("neuronserve-tests/absent")
    with pytest.raises(CompileError, match="not in the Hugging Face cache"):
        model_folder(f"{REPO_ID}@v2")  # a revision the cache does not hold
    with pytest.raises(CompileError, match=r"model folder \./missing does not exist"):
        model_folder("./missing")
    assert split_revision("org/name@v1.2") == ("org/name", "v1.2")
    assert split_revision("org/name") == ("org/name", None)


def test_a_folder_named_like_a_hub_id_never_stands_in_for_it(
    offline_hub, tmp_path, monkeypatch, tiny_embedder_dir
):
    """A ref shaped like a Hub id is the Hub's model even where the working directory (a
    shared one, say) holds a folder of that name; written as a path it is the folder, and
    the log names which was used. The same for a spec file's model beside such a folder."""
    import shutil

    from neuronserve.spec import _model_ref

    monkeypatch.chdir(tmp_path)
    planted = tmp_path / REPO_ID
    shutil.copytree(tiny_embedder_dir, planted)
    (planted / "planted").write_text("")
    found = model_folder(REPO_ID)
    assert found.repo_id == REPO_ID and not (found.folder / "planted").exists()
    assert found.said.startswith(f"the Hugging Face Hub's {REPO_ID} at {'1' * 40}")
    mine = model_folder(f"./{REPO_ID}")
    assert mine.repo_id is None and (mine.folder / "planted").exists()
    assert mine.said == f"the local folder {planted}"
    assert _model_ref(REPO_ID, tmp_path) == REPO_ID
    assert _model_ref(f"./{REPO_ID}", tmp_path) == str(tmp_path / f"./{REPO_ID}")
    # where the Hub has no such model, the error points at the folder's path
    shutil.copytree(tiny_embedder_dir, tmp_path / "org" / "absent")
    with pytest.raises(CompileError, match=r"a folder org/absent exists here.*\./org/absent"):
        model_folder("org/absent")
    # and the log names the one used, before anything is compiled
    from neuronserve.compile import driver

    logged: list[str] = []
    monkeypatch.setenv("NEURONSERVE_CACHE", str(tmp_path / "ns-cache"))
    monkeypatch.setattr(driver, "compile_job", lambda job, progress, log: job.out)
    artifact_cache.compiled(_job(), log=logged.append, progress=False)
    assert f"model {REPO_ID}: the Hugging Face Hub's {REPO_ID} at {'1' * 40}" in logged[0]


def test_the_task_is_read_from_the_config(tmp_path, tiny_embedder_dir, minilm_dir):
    assert config_task(tiny_embedder_dir) == "feature-extraction"
    cases = {
        "rerank": "rerank",  # one label: a cross-encoder
        "text-classification": "text-classification",
        "token-classification": "token-classification",
        "question-answering": "question-answering",
    }
    for task, expected in cases.items():
        folder = tiny_model(tmp_path / task, minilm_dir, task)
        assert config_task(folder) == expected, task


def _job(**compile_fields) -> CompileJob:
    spec = load_spec(None, {"compile": {"model": REPO_ID, **GRID, **compile_fields}})
    return CompileJob.of(spec)


def test_a_local_folder_is_keyed_by_its_files(tmp_path, monkeypatch, tiny_embedder_dir):
    import shutil

    monkeypatch.setenv("NEURONSERVE_CACHE", str(tmp_path / "ns-cache"))
    folder = Path(shutil.copytree(tiny_embedder_dir, tmp_path / "mine"))
    job = CompileJob.of(load_spec(None, {"compile": {"model": str(folder), **GRID}}))
    from neuronserve.compile.hub import ModelFolder

    before = artifact_cache.cache_key(job, ModelFolder(folder))
    (folder / "config.json").write_text((folder / "config.json").read_text() + "\n")
    assert artifact_cache.cache_key(job, ModelFolder(folder)) != before


def test_a_cache_another_user_can_write_is_refused(offline_hub):
    root = Path(os.environ["NEURONSERVE_CACHE"])
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    with pytest.raises(CompileError, match=r"artifact cache .*chmod 700"):
        artifact_cache.compiled(_job(), progress=False)


def test_serve_says_a_missing_folder_is_missing_and_points_at_model(tmp_path):
    from helpers import cli

    done = cli(
        "serve", "front", "org/misspelled", "--run-dir", tmp_path / "front", check=False,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    assert "org/misspelled does not exist or is not a folder" in done.stderr
    assert "--model org/misspelled" in done.stderr
    assert not (tmp_path / "front" / "front.pid").exists()  # nothing was started
