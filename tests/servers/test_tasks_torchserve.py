"""Fill-mask and rerank models in one TorchServe model store, asked as a curl user asks
(`/predictions/<model>`, and SageMaker's `/invocations?model_name=`): answers equal the
Runner's in process, and bad requests are 400s with their neighbours answered."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from helpers import compile_artifact, same_answers, serving_models, tiny_model

from neuronserve.runtime import Runner

pytestmark = pytest.mark.server

DOCS = ["Paris is in France.", "naïve café 🎉", "x", "Zürich has a lake.", "東京", "a b c"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("torchserve-tasks")
    out = {}
    for name, task in (("fill", "fill-mask"), ("rerank", "rerank")):
        model = tiny_model(root / name, minilm_dir, task, seed=13, initializer_range=0.5)
        out[name] = compile_artifact(root / f"{name}-artifact", model, task)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory, models):
    with serving_models(
        tmp_path_factory.mktemp("torchserve-tasks-serve"), "torchserve", models
    ) as spec:
        yield f"http://127.0.0.1:{spec['inference_port']}"


def test_fill_mask_answers_equal_the_runners_and_the_pipelines(server, models):
    from transformers import pipeline

    pipe = pipeline("fill-mask", model=str(models["fill"].parent / "fill"))
    runner = Runner(models["fill"])
    for body in (
        {"inputs": "Ana met [MASK] in Paris."},
        {"inputs": ["naïve [MASK] 🎉", "[MASK] and [MASK]"], "parameters": {"top_k": 3}},
    ):
        for url in (f"{server}/predictions/fill", f"{server}/invocations?model_name=fill"):
            r = requests.post(url, json=body, timeout=60)
            assert r.status_code == 200, r.text
            want = runner.responses_for_bodies([(body, None)])[0]
            assert same_answers(r.json(), want, atol=1e-6)
            assert same_answers(r.json(), pipe(body["inputs"], **body.get("parameters", {})))


def test_rerank_through_predictions_and_invocations(server, models):
    runner = Runner(models["rerank"])
    body = {
        "query": "where is Paris?",
        "documents": DOCS,
        "parameters": {"top_n": 4, "return_documents": True},
    }
    want = runner.responses_for_bodies([(body, None)])[0]
    for url in (f"{server}/predictions/rerank", f"{server}/invocations?model_name=rerank"):
        r = requests.post(url, json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert same_answers(r.json(), want, atol=1e-6) and len(r.json()) == 4


def test_bad_requests_are_400s_and_their_neighbours_are_answered(server, models):
    fill = Runner(models["fill"])
    good = {"inputs": "Bob met [MASK]."}
    bad = [
        {"inputs": "no mask at all"},
        {"inputs": "[MASK]", "parameters": {"top_k": 99}},
        {"inputs": 5},
    ]
    bodies = [good, *bad, good]
    with ThreadPoolExecutor(len(bodies)) as pool:  # sent at once: TorchServe may batch them
        answers = list(
            pool.map(
                lambda b: requests.post(f"{server}/predictions/fill", json=b, timeout=60), bodies
            )
        )
    assert [a.status_code for a in answers] == [200, 400, 400, 400, 200]
    assert "no mask token" in answers[1].json()["error"]
    want = fill.responses_for_bodies([(good, None)])[0]
    assert same_answers(answers[0].json(), want, atol=1e-6) and same_answers(
        answers[4].json(), want, atol=1e-6
    )
    r = requests.post(
        f"{server}/predictions/rerank", json={"query": "q", "documents": []}, timeout=60
    )
    assert r.status_code == 400 and "at least one document" in r.json()["error"]
