"""Token classification and question answering behind a real tritonserver, asked with
tritonclient the way a Triton user asks (TEXT, TEXT_PAIR, request parameters): the JSON
per text in ENTITIES / ANSWERS equals the Runner's in process, and a bad request sent
together with good ones fails alone."""

from __future__ import annotations

import json

import pytest
import tritonclient.http as httpclient
from helpers import (
    QA_CONTEXT,
    compile_artifact,
    qa_reference,
    same_answers,
    serving_models,
    settled,
    tiny_model,
    triton_rows,
)
from tritonclient.utils import InferenceServerException

from neuronserve.runtime import Runner

pytestmark = pytest.mark.server

TEXTS = ["Ana met Bob in Paris", "naïve café 🎉 in Zürich, said Ana.", "a", "東京 and São Paulo"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("triton-tasks")
    out = {}
    for name, task in (("ner", "token-classification"), ("qa", "question-answering")):
        model = tiny_model(root / name, minilm_dir, task, seed=11, initializer_range=0.5)
        out[name] = compile_artifact(root / f"{name}-artifact", model, task)
    return out


@pytest.fixture(scope="module")
def client(tmp_path_factory, models):
    work = tmp_path_factory.mktemp("triton-tasks-serve")
    with serving_models(work, "triton", models) as spec:
        config = (work / "repo" / "qa" / "config.pbtxt").read_text()
        assert 'name: "ANSWERS"' in config and "optional: true" not in config  # required
        client = httpclient.InferenceServerClient(f"127.0.0.1:{spec['http_port']}", concurrency=4)
        yield client
        client.close()  # tritonserver waits for open connections before it stops


def _inputs(texts, pairs=None):
    return [triton_rows("TEXT", texts)] + ([triton_rows("TEXT_PAIR", pairs)] if pairs else [])


def _json(result, name):
    return [json.loads(v[0]) for v in result.as_numpy(name)]


def test_entities_equal_the_runners_and_the_pipelines(client, models):
    from transformers import pipeline

    pipe = pipeline("token-classification", model=str(models["ner"].parent / "ner"))
    runner = Runner(models["ner"])
    for params in (
        {"aggregation_strategy": "simple"},
        {"aggregation_strategy": "max", "ignore_labels": "O,MISC"},
    ):
        got = _json(client.infer("ner", _inputs(TEXTS), parameters=params), "ENTITIES")
        native = {**params, "ignore_labels": params.get("ignore_labels", "O").split(",")}
        want = runner.responses_for_bodies([({"inputs": TEXTS, "parameters": native}, None)])[0]
        assert any(want) and same_answers(got, want, atol=1e-6)
        by_pipeline = pipe(TEXTS, aggregation_strategy=params["aggregation_strategy"])
        ignored = set(native["ignore_labels"])
        assert same_answers(
            got, [[e for e in t if e["entity_group"] not in ignored] for t in by_pipeline]
        )


def test_answers_equal_the_runners_and_a_bad_request_fails_alone(client, models):
    runner = Runner(models["qa"])
    questions = ["Who met Bob?", "Where is the café?"]
    params = {"top_k": 2, "max_answer_len": 6}
    want = runner.responses_for_bodies(
        [
            (
                {
                    "inputs": [{"question": q, "context": QA_CONTEXT} for q in questions],
                    "parameters": params,
                },
                None,
            )
        ]
    )[0]
    model_dir = models["qa"].parent / "qa"
    assert same_answers(
        want, [qa_reference(model_dir, q, QA_CONTEXT, 32, **params) for q in questions]
    )
    pending = [
        client.async_infer("qa", _inputs(questions, [QA_CONTEXT] * 2), parameters=params),
        client.async_infer("qa", _inputs(questions)),  # no context: Triton refuses it itself
        client.async_infer("qa", _inputs(questions[:1], [QA_CONTEXT]), parameters={"top_k": 0}),
        client.async_infer("qa", _inputs(questions, [QA_CONTEXT] * 2), parameters=params),
    ]
    results = settled(pending)
    for bad, needle in ((results[1], "TEXT_PAIR"), (results[2], "top_k")):
        assert isinstance(bad, InferenceServerException) and bad.status() == "400"
        assert needle in bad.message(), bad.message()
    for good in (results[0], results[3]):
        assert same_answers(_json(good, "ANSWERS"), want, atol=1e-6)
