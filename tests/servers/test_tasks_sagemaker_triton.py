"""Question answering through the SageMaker `serve` entrypoint with Triton behind it:
the front takes {"question", "context"} (or a list of them as "inputs"), sends question
and context as TEXT / TEXT_PAIR rows with the request's parameters, and answers like the
Runner in process; bad requests are 4xx with their message."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from helpers import QA_CONTEXT, compile_artifact, same_answers, start_sagemaker, tiny_model

from neuronserve.runtime import Runner

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def qa(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("sagemaker-qa")
    model = tiny_model(
        root / "model", minilm_dir, "question-answering", seed=17, initializer_range=0.5
    )
    return compile_artifact(root / "artifact", model, "question-answering")


@pytest.fixture(scope="module")
def serve(tmp_path_factory, qa):
    serve = start_sagemaker(tmp_path_factory.mktemp("sagemaker-triton-qa"), qa, "triton")
    yield serve
    serve.stop()


def test_invocations_answer_like_the_runner(serve, qa):
    runner = Runner(qa)
    bodies = [
        {"question": "Who met Bob?", "context": QA_CONTEXT},
        {
            "question": "Where?",
            "context": QA_CONTEXT,
            "parameters": {"top_k": 3, "handle_impossible_answer": True},
        },
        {"inputs": [{"question": "Who?", "context": c} for c in (QA_CONTEXT, "a", "東京 🎉")]},
    ]
    for body in bodies:
        r = requests.post(f"{serve.url}/invocations", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert same_answers(r.json(), runner.responses_for_bodies([(body, None)])[0], atol=1e-6)


def test_bad_requests_fail_alone(serve):
    good = {"question": "Who met Bob?", "context": QA_CONTEXT}
    bodies = [
        good,
        {"question": "Who?"},
        {"question": "Who?", "context": ["not", "a", "string"]},
        {"question": "Who?", "context": QA_CONTEXT, "parameters": {"doc_stride": -1}},
        {"question": " ".join(["why"] * 40), "context": QA_CONTEXT},
        good,
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(
            pool.map(
                lambda b: requests.post(f"{serve.url}/invocations", json=b, timeout=60), bodies
            )
        )
    assert [a.status_code for a in answers] == [200, 400, 400, 400, 413, 200]
    assert "context" in answers[1].json()["error"] and "doc_stride" in answers[3].json()["error"]
    assert answers[0].json() == answers[5].json()
