"""What users of Hugging Face's SageMaker containers bring: the toolkit's body parameters
(`truncation`, `padding`, `return_all_scores`, the tokenizer's and the pipelines' names)
mean here what they mean there, and its environment (HF_OPTIMUM_BATCH_SIZE and
HF_OPTIMUM_SEQUENCE_LENGTH, HF_API_TOKEN, model data that is a Hugging Face model folder)
sets what it sets there. Compiling such model data at start: tests/compile."""

from __future__ import annotations

import shutil

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


def test_the_neuron_containers_shape_is_the_largest_bucket(monkeypatch):
    monkeypatch.setenv("HF_OPTIMUM_BATCH_SIZE", "6")
    monkeypatch.setenv("HF_OPTIMUM_SEQUENCE_LENGTH", "384")
    assert sagemaker.compile_shape() == {
        "batch_sizes": [1, 4, 6],
        "sequence_lengths": [16, 32, 64, 128, 384],
    }
    monkeypatch.setenv("HF_OPTIMUM_SEQUENCE_LENGTH", "8")
    assert sagemaker.compile_shape()["sequence_lengths"] == [8]
    monkeypatch.delenv("HF_OPTIMUM_BATCH_SIZE")
    assert sagemaker.compile_shape() == {"sequence_lengths": [8]}
    for bad in ("0", "-1", "eight", "1.5"):
        monkeypatch.setenv("HF_OPTIMUM_SEQUENCE_LENGTH", bad)
        with pytest.raises(sagemaker.PlatformError, match="HF_OPTIMUM_SEQUENCE_LENGTH"):
            sagemaker.compile_shape()


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
