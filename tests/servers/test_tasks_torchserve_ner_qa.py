"""Token classification and question answering in one TorchServe model store, asked as
a curl user asks (`/predictions/<model>`, SageMaker's `/invocations?model_name=`):
entities equal the transformers pipeline's for every aggregation strategy (a text cut on
request keeps offsets into the text sent), answers equal the QA pipeline's algorithm over
the eager model (a context longer than the largest bucket runs as windows), and bad
requests sent together with good ones are 4xx alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from helpers import (
    QA_CONTEXT,
    compile_artifact,
    qa_reference,
    same_answers,
    serving_models,
    tiny_model,
)

pytestmark = pytest.mark.server

TEXTS = ["Ana met Bob in Paris", "naïve café 🎉 in Zürich, said Ana.", "a", "東京 and São Paulo"]
LONG = (
    "Ünïcode 🎉 the quick brown fox jumps over the lazy dog near New York, then runs back "
    "home past Ana and Bob in Paris, Zürich and 東京 before it rests in São Paulo"
)


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("torchserve-ner-qa")
    out = {}
    for name, task in (("ner", "token-classification"), ("qa", "question-answering")):
        model = tiny_model(root / name, minilm_dir, task, seed=31, initializer_range=0.5)
        out[name] = compile_artifact(root / f"{name}-artifact", model, task)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory, models):
    work = tmp_path_factory.mktemp("torchserve-ner-qa-serve")
    with serving_models(work, "torchserve", models) as spec:
        yield f"http://127.0.0.1:{spec['inference_port']}"


def _post(server: str, path: str, body) -> requests.Response:
    return requests.post(f"{server}/{path}", json=body, timeout=60)


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_entities_equal_the_pipelines(server, models, strategy):
    from transformers import pipeline

    pipe = pipeline("token-classification", model=str(models["ner"].parent / "ner"))
    want = pipe(TEXTS, aggregation_strategy=strategy)
    assert any(want), "the random model found no entity: the comparison would be empty"
    body = {"inputs": TEXTS, "parameters": {"aggregation_strategy": strategy}}
    for path in ("predictions/ner", "invocations?model_name=ner"):
        r = _post(server, path, body)
        assert r.status_code == 200, r.text
        assert same_answers(r.json(), want)


def test_a_text_cut_on_request_keeps_offsets_into_the_text_sent(server, models):
    from transformers import pipeline

    pipe = pipeline("token-classification", model=str(models["ner"].parent / "ner"))
    pipe.tokenizer.model_max_length = 32  # the largest bucket: where the server cuts
    assert len(pipe.tokenizer(LONG)["input_ids"]) > 32
    refused = _post(server, "predictions/ner", {"inputs": LONG})
    assert refused.status_code == 413, refused.text  # not asked to cut: refused, not cut
    r = _post(server, "predictions/ner", {"inputs": LONG, "parameters": {"truncate": True}})
    assert r.status_code == 200, r.text
    want = pipe(LONG, aggregation_strategy="none")
    assert want and same_answers(r.json(), want)
    assert max(e["end"] for e in r.json()) < LONG.index("Paulo")


def test_answers_equal_the_qa_pipelines_across_windows(server, models):
    model_dir = models["qa"].parent / "qa"
    questions = ["Who met Bob?", "Where is the café? 🎉", "x"]
    params = {"top_k": 2, "max_answer_len": 6}
    body = {"inputs": [{"question": q, "context": QA_CONTEXT} for q in questions]}
    r = _post(server, "predictions/qa", body | {"parameters": params})
    assert r.status_code == 200, r.text
    want = [qa_reference(model_dir, q, QA_CONTEXT, 32, **params) for q in questions]
    assert same_answers(r.json(), want)
    one = {"question": "Who flew home?", "context": QA_CONTEXT}  # ~50 tokens: several windows
    r = _post(server, "invocations?model_name=qa", one)
    assert r.status_code == 200, r.text
    assert same_answers(r.json(), qa_reference(model_dir, one["question"], QA_CONTEXT, 32))
    tiny = {"question": "Who?", "context": "東京", "parameters": {"handle_impossible_answer": True}}
    r = _post(server, "predictions/qa", tiny)
    assert r.status_code == 200, r.text
    assert same_answers(
        r.json(), qa_reference(model_dir, "Who?", "東京", 32, handle_impossible_answer=True)
    )


def test_bad_requests_fail_alone(server):
    good_ner = {"inputs": TEXTS[0], "parameters": {"aggregation_strategy": "first"}}
    good_qa = {"question": "Who met Bob?", "context": QA_CONTEXT}
    sent = [
        ("ner", good_ner, 200, None),
        ("ner", {"inputs": 5}, 400, "inputs"),
        ("ner", {"inputs": "x", "parameters": {"aggregation_strategy": "best"}}, 400, "best"),
        ("qa", good_qa, 200, None),
        ("qa", {"question": "Who?"}, 400, "context"),
        ("qa", {"question": "Who?", "context": ["a", "list"]}, 400, "context"),
        ("qa", good_qa | {"parameters": {"max_answer_len": 0}}, 400, "max_answer_len"),
        ("ner", good_ner, 200, None),
        ("qa", good_qa, 200, None),
    ]
    with ThreadPoolExecutor(len(sent)) as pool:  # at once: TorchServe may batch them together
        answers = list(pool.map(lambda s: _post(server, f"predictions/{s[0]}", s[1]), sent))
    assert [a.status_code for a in answers] == [s[2] for s in sent]
    for (_, _, _, needle), answer in zip(sent, answers, strict=True):
        if needle:
            assert needle in answer.json()["error"], answer.json()
    assert answers[0].json() == answers[7].json() and answers[0].json()
    assert answers[3].json() == answers[8].json() and answers[3].json()["answer"]
