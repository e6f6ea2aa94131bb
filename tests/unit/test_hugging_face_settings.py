"""What users of Hugging Face's SageMaker containers bring: the toolkit's body parameters
(`truncation`, `padding`, `return_all_scores`, the tokenizer's and the pipelines' names)
mean here what they mean there, and its environment (HF_OPTIMUM_BATCH_SIZE and
HF_OPTIMUM_SEQUENCE_LENGTH, HF_API_TOKEN, model data that is a Hugging Face model folder)
sets what it sets there. Compiling such model data at start: tests/compile."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from in_process_front import front

from neuronserve.platforms.sagemaker import entrypoint as sagemaker
from neuronserve.tasks import RequestError

LONG = "a rather long sentence of words " * 200  # far over the tiny model's 512 tokens


@pytest.fixture
def two(tmp_path, tiny_runner, classifier_runner):
    client, _, _ = front(tmp_path, {"tiny": tiny_runner, "tiny-classifier": classifier_runner})
    return client


def _invoke(client, model: str, body: dict):
    headers = {"X-Amzn-SageMaker-Target-Model": model}
    return client.post("/invocations", json=body, headers=headers)


def test_the_toolkits_truncation_and_padding_mean_what_they_mean_there(two):
    ours = _invoke(two, "tiny", {"inputs": LONG, "parameters": {"truncate": True}})
    assert ours.status_code == 200
    for value in (True, "longest_first", "only_first"):
        params = {"truncation": value, "padding": "max_length"}
        theirs = _invoke(two, "tiny", {"inputs": LONG, "parameters": params})
        assert theirs.status_code == 200, theirs.text
        assert theirs.json() == ours.json()
    refused = _invoke(two, "tiny", {"inputs": LONG, "parameters": {"truncation": False}})
    too_long = _invoke(two, "tiny", {"inputs": LONG, "parameters": {"truncate": False}})
    assert refused.status_code == too_long.status_code and 400 <= refused.status_code < 500
    for bad, said in (
        ({"truncation": "sometimes"}, '"truncation" must be'),
        ({"truncation": True, "truncate": False}, "disagree"),
        ({"padding": 7}, '"padding" must be'),
        ({"max_length": 16}, "unknown parameters ['max_length']"),
    ):
        r = _invoke(two, "tiny", {"inputs": "fine", "parameters": bad})
        assert r.status_code == 400 and said in r.json()["error"], (bad, r.text)
    assert _invoke(two, "tiny", {"inputs": "still fine"}).status_code == 200


def test_return_all_scores_is_top_k_for_a_classifier(two):
    every = _invoke(two, "tiny-classifier", {"inputs": "ok", "parameters": {"top_k": None}})
    best = _invoke(two, "tiny-classifier", {"inputs": "ok", "parameters": {"top_k": 1}})
    assert len(every.json()) == 3 and len(best.json()) == 1
    for flag, want in ((True, every), (False, best)):
        params = {"return_all_scores": flag}
        r = _invoke(two, "tiny-classifier", {"inputs": "ok", "parameters": params})
        assert r.status_code == 200 and r.json() == want.json()
    both = {"return_all_scores": True, "top_k": 2}
    r = _invoke(two, "tiny-classifier", {"inputs": "ok", "parameters": both})
    assert r.status_code == 400 and "not both" in r.text
    # an embedder has no scores: the name is unknown there, as any other
    r = _invoke(two, "tiny", {"inputs": "ok", "parameters": {"return_all_scores": True}})
    assert r.status_code == 400 and "return_all_scores" in r.text


def test_the_neuron_containers_shape_is_the_largest_bucket():
    from neuronserve.spec import SpecError, from_environment

    env = {"HF_OPTIMUM_BATCH_SIZE": "6", "HF_OPTIMUM_SEQUENCE_LENGTH": "384"}
    assert from_environment(env)["compile"] == {
        "batch_sizes": [1, 4, 6],
        "sequence_lengths": [16, 32, 64, 128, 384],
    }
    assert from_environment({"HF_OPTIMUM_SEQUENCE_LENGTH": "8"}) == {
        "compile": {"sequence_lengths": [8]}
    }
    for bad in ("0", "-1", "eight", "1.5"):
        with pytest.raises(SpecError, match="HF_OPTIMUM_SEQUENCE_LENGTH"):
            from_environment({"HF_OPTIMUM_SEQUENCE_LENGTH": bad})


def test_every_container_variable_sets_the_field_that_declares_it(tmp_path, monkeypatch):
    """The container's variables are read from the spec's fields (one declaration each):
    SageMaker's defaults hold where none is set, each set one lands in its fields, a bad
    value is refused naming the variable, and the SageMaker guide names every one."""
    from neuronserve.spec import environment_variables

    declared = environment_variables()
    for var in declared:
        monkeypatch.delenv(var, raising=False)
    for var in ("HF_MODEL_ID", "HF_TRUST_REMOTE_CODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NEURONSERVE_MODEL_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("SAGEMAKER_MULTI_MODEL", "true")  # starts with no model
    spec = sagemaker.sagemaker_spec(tmp_path / "work")
    assert (spec.front.address, spec.front.port, spec.front.deadline_s) == ("0.0.0.0", 8080, 60)
    assert spec.worker.response_timeout_s == 60 and spec.front.metrics_auth
    given = {
        "SAGEMAKER_BIND_TO_PORT": ("9090", 9090),
        "NEURONSERVE_BIND": ("127.0.0.1", "127.0.0.1"),
        "SAGEMAKER_MODEL_SERVER_TIMEOUT": ("30", 30),
        "SAGEMAKER_MODEL_SERVER_WORKERS": ("3", 3),
        "NEURONSERVE_CORES_PER_WORKER": ("2", 2),
        "NEURONSERVE_MAX_IN_FLIGHT": ("7", 7),
        "NEURONSERVE_MAX_QUEUED": ("11", 11),
        "NEURONSERVE_METRICS_AUTH": ("off", False),
        "NEURONSERVE_MEMORY_BUDGET_MB": ("512", 512),
        "NEURONSERVE_TARGET": ("neuronx", "neuronx"),
        # kept to refuse Triton and TorchServe: our own server's name is no setting
        "NEURONSERVE_ENGINE": ("native", None),
        "SAGEMAKER_MULTI_MODEL": ("TRUE", True),
    }
    for var, (text, _) in given.items():
        monkeypatch.setenv(var, text)
    spec = sagemaker.sagemaker_spec(tmp_path / "work")
    for var, (_, want) in given.items():
        for key, field in declared[var]:
            assert getattr(getattr(spec, key), field) == want, (var, key, field)
    monkeypatch.setenv("SAGEMAKER_BIND_TO_PORT", "80800")
    with pytest.raises(sagemaker.PlatformError, match="SAGEMAKER_BIND_TO_PORT='80800'"):
        sagemaker.sagemaker_spec(tmp_path / "work")
    monkeypatch.setenv("SAGEMAKER_BIND_TO_PORT", "8080")
    monkeypatch.setenv("NEURONSERVE_ENGINE", "tgi")
    with pytest.raises(sagemaker.PlatformError, match=r"NEURONSERVE_ENGINE='tgi'.*own workers"):
        sagemaker.sagemaker_spec(tmp_path / "work")
    # the guide's table: every variable, with the fields it sets, and no other
    guide = (Path(__file__).parents[2] / "docs" / "guides" / "sagemaker.md").read_text()
    rows = re.findall(r"^\| `([A-Z_]+)` \| ([^|]+) \|", guide, re.MULTILINE)
    table = {var: sorted(tuple(f.split(".")) for f in re.findall(r"`([a-z_.]+)`", fields))
             for var, fields in rows if "." in fields}  # fmt: skip
    assert table == {var: sorted(fields) for var, fields in declared.items()}


def test_hf_api_token_is_hf_token_unless_that_is_set(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_API_TOKEN", "hf_old")
    sagemaker.hub_token()
    import os

    assert os.environ["HF_TOKEN"] == "hf_old"
    monkeypatch.setenv("HF_TOKEN", "hf_new")
    sagemaker.hub_token()
    assert os.environ["HF_TOKEN"] == "hf_new"


def test_model_data_that_is_a_hugging_face_folder_is_compiled_at_start(
    tmp_path, monkeypatch, tiny_embedder_dir, tiny_artifact
):
    for var in ("HF_MODEL_ID", "SAGEMAKER_MULTI_MODEL", "HF_OPTIMUM_BATCH_SIZE"):
        monkeypatch.delenv(var, raising=False)
    data = tmp_path / "model"
    shutil.copytree(tiny_embedder_dir, data)
    monkeypatch.setenv("NEURONSERVE_MODEL_DIR", str(data))
    monkeypatch.setenv("HF_OPTIMUM_SEQUENCE_LENGTH", "48")
    spec = sagemaker.sagemaker_spec(tmp_path / "work")
    assert [s.model for s in spec.model_sources()] == [str(data)]
    assert spec.compile.sequence_lengths == [16, 32, 48]
    # an artifact (or a store) as model data is served as it is
    monkeypatch.setenv("NEURONSERVE_MODEL_DIR", str(tiny_artifact))
    assert sagemaker.sagemaker_spec(tmp_path / "work2").model_sources() == []
    # a multi-model endpoint loads what it is told, later
    monkeypatch.setenv("NEURONSERVE_MODEL_DIR", str(data))
    monkeypatch.setenv("SAGEMAKER_MULTI_MODEL", "true")
    assert sagemaker.sagemaker_spec(tmp_path / "work3").model_sources() == []


def test_a_request_error_names_the_toolkit_parameter():
    from neuronserve.tasks.base import toolkit_parameters

    with pytest.raises(RequestError, match="return_all_scores"):
        toolkit_parameters({"return_all_scores": "yes"}, frozenset({"top_k"}))
    assert toolkit_parameters({"top_k": 2}, frozenset({"top_k"})) == {"top_k": 2}


def test_what_the_toolkit_would_run_as_code_is_refused_saying_why(
    tmp_path, monkeypatch, tiny_embedder_dir
):
    for var in ("HF_MODEL_ID", "SAGEMAKER_MULTI_MODEL", "HF_TRUST_REMOTE_CODE"):
        monkeypatch.delenv(var, raising=False)
    data = tmp_path / "model"
    shutil.copytree(tiny_embedder_dir, data)
    (data / "code").mkdir()
    (data / "code" / "inference.py").write_text("def model_fn(model_dir): ...\n")
    monkeypatch.setenv("NEURONSERVE_MODEL_DIR", str(data))
    with pytest.raises(sagemaker.PlatformError, match=r"code/inference.py.*never run"):
        sagemaker.sagemaker_spec(tmp_path / "work")
    monkeypatch.setenv("HF_MODEL_ID", "org/model")
    monkeypatch.setenv("HF_TRUST_REMOTE_CODE", "true")
    with pytest.raises(sagemaker.PlatformError, match="never runs a model repository's own"):
        sagemaker.sagemaker_spec(tmp_path / "work")


def test_the_pipelines_task_aliases_are_their_tasks(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TRUST_REMOTE_CODE", raising=False)
    monkeypatch.setenv("HF_MODEL_ID", "org/model")
    for alias, task in (("sentiment-analysis", "text-classification"),
                        ("ner", "token-classification"),
                        ("fill-mask", "fill-mask")):  # fmt: skip
        monkeypatch.setenv("HF_TASK", alias)
        [source] = sagemaker.sagemaker_spec(tmp_path / "work").model_sources()
        assert source.task == task
