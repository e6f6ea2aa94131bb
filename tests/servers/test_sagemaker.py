"""The SageMaker `serve` entrypoint of a build context of several models (MiniLM, a
reranker, QA and an image classifier), run as the image runs it: /ping
is 503 until every worker is ready, SAGEMAKER_MODEL_SERVER_WORKERS is capped at the
host's core groups, and /invocations answers each model, named by the header SageMaker
multi-model endpoints send (X-Amzn-SageMaker-Target-Model), like its Runner in process;
bad requests fail alone."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from helpers import (
    QA_CONTEXT,
    check_ping_and_workers,
    check_sagemaker_contract,
    same_answers,
    start_sagemaker,
)

from neuronserve.images import sample_images
from neuronserve.runtime import Runner

pytestmark = pytest.mark.server

IMAGES = sample_images(9, seed=8)
QUERY = "where is the lake?"
DOCS = [
    "Zürich has a lake.",
    "naïve café 🎉",
    "x",
    "Paris is in France.",
    "東京",
    "a b c",
    "lake lake",
]
MODELS = ["rerank", "qa", "labels"]


@pytest.fixture(scope="module")
def serve(tmp_path_factory, minilm_artifact, task_models):
    artifacts = [minilm_artifact, *(task_models[n][1] for n in MODELS)]
    serve = start_sagemaker(tmp_path_factory.mktemp("sagemaker"), artifacts)
    yield serve
    serve.stop()


def to(model: str) -> dict[str, str]:
    return {"X-Amzn-SageMaker-Target-Model": model}


def test_ping_is_503_until_ready_and_workers_are_capped(serve):
    check_ping_and_workers(serve)
    assert (
        "serving minilm (feature-extraction), rerank (rerank), qa (question-answering)"
        in serve.log.read_text()
    )


def test_invocations_answer_like_the_runner(serve, minilm_runner):
    check_sagemaker_contract(serve.url, minilm_runner, to("minilm"))
    unnamed = requests.post(f"{serve.url}/invocations", json={"inputs": "x"}, timeout=60)
    assert unnamed.status_code == 400 and "X-Amzn-SageMaker-Target-Model" in unnamed.json()["error"]


def eager_scores(model_dir, query, documents):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = model(
            **tok([query] * len(documents), documents, return_tensors="pt", padding=True)
        ).logits
    return torch.sigmoid(logits[:, 0]).tolist()


def test_invocations_and_tei_rerank_rank_like_the_eager_model(serve, task_models):
    want = eager_scores(task_models["rerank"][0], QUERY, DOCS)
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])
    r = requests.post(
        f"{serve.url}/invocations",
        json={"query": QUERY, "documents": DOCS},
        headers=to("rerank"),
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert [x["index"] for x in r.json()] == order
    assert all(abs(x["score"] - want[x["index"]]) < 1e-4 for x in r.json())
    # the one reranker: TEI's /rerank finds it without a name
    tei = requests.post(
        f"{serve.url}/rerank",
        json={"query": QUERY, "texts": DOCS, "top_n": 3, "return_text": True},
        timeout=60,
    )
    assert tei.status_code == 200, tei.text
    assert [(x["index"], x["text"]) for x in tei.json()] == [(i, DOCS[i]) for i in order[:3]]
    empty = requests.post(
        f"{serve.url}/invocations",
        json={"query": QUERY, "documents": []},
        headers=to("rerank"),
        timeout=60,
    )
    assert empty.status_code == 400 and "at least one document" in empty.json()["error"]


def test_answers_like_the_runner_and_bad_questions_fail_alone(serve, task_models):
    runner = Runner(task_models["qa"][1])
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
        r = requests.post(f"{serve.url}/invocations", json=body, headers=to("qa"), timeout=60)
        assert r.status_code == 200, r.text
        assert same_answers(r.json(), runner.responses_for_bodies([(body, None)])[0], atol=1e-6)
    good = bodies[0]
    sent = [
        good,
        {"question": "Who?"},
        {"question": "Who?", "context": ["not", "a", "string"]},
        {"question": "Who?", "context": QA_CONTEXT, "parameters": {"doc_stride": -1}},
        {"question": " ".join(["why"] * 40), "context": QA_CONTEXT},
        good,
    ]
    with ThreadPoolExecutor(len(sent)) as pool:
        answers = list(
            pool.map(
                lambda b: requests.post(
                    f"{serve.url}/invocations", json=b, headers=to("qa"), timeout=60
                ),
                sent,
            )
        )
    assert [a.status_code for a in answers] == [200, 400, 400, 400, 413, 200]
    assert "context" in answers[1].json()["error"] and "doc_stride" in answers[3].json()["error"]
    assert answers[0].json() == answers[5].json()


def test_images_answer_like_the_runner(serve, task_models):
    runner = Runner(task_models["labels"][1])
    url, target = f"{serve.url}/invocations", to("labels")
    raw = requests.post(
        url, data=IMAGES[0], headers={"Content-Type": "image/jpeg", **target}, timeout=60
    )
    assert raw.status_code == 200, raw.text
    assert same_answers(raw.json(), runner.responses_for_bodies([(IMAGES[0], "image/jpeg")])[0])
    form = requests.post(
        url,
        files=[("a", ("a.png", IMAGES[1], "image/png")), ("b", ("b.jpg", IMAGES[3], "image/jpeg"))],
        data={"parameters": '{"top_k": 1}'},
        headers=target,
        timeout=60,
    )
    assert form.status_code == 200, form.text
    both = {
        "inputs": [base64.b64encode(b).decode() for b in (IMAGES[1], IMAGES[3])],
        "parameters": {"top_k": 1},
    }
    assert same_answers(form.json(), runner.responses_for_bodies([(both, None)])[0])
    small = [b for b in IMAGES if len(b) < 100_000]  # the body stays under max_body_bytes
    many = {"inputs": [base64.b64encode(b).decode() for b in (small * 3)[:9]]}  # over a batch
    r = requests.post(url, json=many, headers=target, timeout=60)
    assert r.status_code == 200 and same_answers(
        r.json(), runner.responses_for_bodies([(many, None)])[0]
    )
    bad = requests.post(
        url, data=b"GIF89a...", headers={"Content-Type": "image/gif", **target}, timeout=60
    )
    assert bad.status_code == 400 and "not an image" in bad.json()["error"]
