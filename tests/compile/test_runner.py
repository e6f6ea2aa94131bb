"""The Runner in-process: numbers against independent references, splitting,
truncation, per-request errors."""

import json

import numpy as np
import pytest
from helpers import SENTENCES, cosine, eager_classifier_scores, reference_embeddings

from neuronserve.execution import RunReport
from neuronserve.runtime import Runner
from neuronserve.tasks import RequestError
from neuronserve.tasks.base import RequestLimits


@pytest.fixture(scope="module")
def runner(minilm_artifact):
    return Runner(minilm_artifact)


@pytest.fixture(scope="module")
def reference(minilm_dir):
    return reference_embeddings(minilm_dir, SENTENCES)


def test_embeddings_match_reference(runner, reference):
    # one request with every sentence, and every sentence as its own request
    [batch] = runner.responses_for_bodies([({"inputs": SENTENCES}, None)])
    singles = runner.responses_for_bodies([({"inputs": s}, None) for s in SENTENCES])
    for i, s in enumerate(SENTENCES):
        assert cosine(batch[i], reference[i]) >= 0.9999, s
        assert cosine(singles[i], reference[i]) >= 0.9999, s


def test_batch_larger_than_largest_bucket_is_split(runner, reference):
    texts = SENTENCES * 2  # 22 texts, largest bucket holds 8
    report = RunReport()
    [out] = runner.responses_for_bodies([({"inputs": texts}, None)], report)
    assert len(out) == len(texts)
    assert len(report.runs) >= 3 and all(r.rows <= 8 for r in report.runs)
    assert sum(r.rows for r in report.runs) == len(texts)
    for i in range(len(texts)):
        assert cosine(out[i], reference[i % len(SENTENCES)]) >= 0.9999


def test_short_texts_use_small_buckets(runner):
    report = RunReport()
    runner.responses_for_bodies([({"inputs": ["hi", "yo"]}, None)], report)
    # the shortest length, in whichever runs the compile's bucket times say cost least:
    # one (4, 16) or two (1, 16)
    assert {r.bucket.seq for r in report.runs} == {16}
    assert sum(r.rows for r in report.runs) == 2
    costs = runner.manifest.bucket_ms
    assert sum(costs[r.bucket.key] for r in report.runs) == min(
        costs["b4_s16"], 2 * costs["b1_s16"]
    )
    padded = sum(r.bucket.batch * r.bucket.seq for r in report.runs)
    assert report.padding_ratio == pytest.approx((padded - 6) / 6)


def test_overlong_text_without_truncation_fails_alone(minilm_artifact, minilm_dir):
    strict = Runner(minilm_artifact, warmup=False)  # the artifact records truncation off
    long_text = " ".join(["word"] * 400)
    out = strict.responses_for_bodies(
        [
            ({"inputs": "fine"}, None),
            ({"inputs": ["ok", long_text]}, None),
            ({"inputs": "also fine"}, None),
        ]
    )
    assert isinstance(out[1], RequestError) and out[1].status == 413
    assert "402 tokens" in out[1].message and "at most 256" in out[1].message
    ref = reference_embeddings(minilm_dir, ["fine", "also fine"])
    assert cosine(out[0], ref[0]) >= 0.9999 and cosine(out[2], ref[1]) >= 0.9999


def test_overlong_text_with_truncation_keeps_first_tokens(minilm_artifact, minilm_dir):
    runner = Runner(minilm_artifact, truncation=True)
    import torch
    from transformers import AutoModel, AutoTokenizer

    long_text = " ".join(f"token{i}" for i in range(300))
    [out] = runner.responses_for_bodies([({"inputs": long_text}, None)])
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    model = AutoModel.from_pretrained(minilm_dir).eval()
    enc = tok(long_text, truncation=True, max_length=256, return_tensors="pt")
    assert enc["input_ids"].shape[1] == 256
    with torch.no_grad():
        h = model(**enc).last_hidden_state.mean(1)[0].numpy()
    assert cosine(out, h) >= 0.9999


@pytest.mark.parametrize(
    "body,ctype,needle",
    [
        (b'{"inputs": ', "application/json", "not valid JSON"),
        ({"inputs": 3}, None, "must be a string"),
        ({"text": "hi"}, None, 'no "inputs"'),
        ({"inputs": []}, None, "empty list"),
        ({"inputs": "x", "parameters": {"top_k": 2}}, None, "unknown parameters"),
        (b"\xff\xfe\xfa", "text/plain", "not valid UTF-8"),
        (b"[1, 2", None, "not valid JSON"),
    ],
)
def test_bad_requests_fail_alone(runner, body, ctype, needle):
    out = runner.responses_for_bodies(
        [({"inputs": "good"}, None), (body, ctype), ({"inputs": "good"}, None)]
    )
    assert isinstance(out[1], RequestError) and out[1].status == 400
    assert needle in out[1].message
    assert np.array_equal(out[0], out[2]) and len(out[0]) == 384


def test_plain_text_and_json_agree(runner):
    a, b, c = runner.responses_for_bodies(
        [
            ("hello world", "text/plain"),
            (b'{"inputs": "hello world"}', None),
            (b"hello world", None),
        ]
    )
    assert np.array_equal(a, b) and np.array_equal(b, c)


def test_classifier_matches_eager(classifier_artifact, classifier_dir):
    runner = Runner(classifier_artifact)
    texts = ["I loved it", "terrible service", " ".join(["meh"] * 30)]
    pairs = [("is it good?", "yes it is"), ("a", "b")]
    want = eager_classifier_scores(classifier_dir, texts + pairs)
    [single] = runner.responses_for_bodies(
        [({"inputs": texts[0], "parameters": {"top_k": None}}, None)]
    )
    assert [r["label"] for r in single] == [
        ["negative", "neutral", "positive"][i] for i in np.argsort(-want[0], kind="stable")
    ]
    [many, paired] = runner.responses_for_bodies(
        [
            ({"inputs": texts, "parameters": {"top_k": 3}}, None),
            (
                {
                    "inputs": [{"text": a, "text_pair": b} for a, b in pairs],
                    "parameters": {"top_k": 3},
                },
                None,
            ),
        ]
    )
    labels = ["negative", "neutral", "positive"]
    for got, ref in zip(many + paired, want, strict=True):
        scores = {r["label"]: r["score"] for r in got}
        assert np.allclose([scores[lab] for lab in labels], ref, atol=1e-5)
        assert got[0]["label"] == labels[int(np.argmax(ref))]
    [top1] = runner.responses_for_bodies([({"inputs": "I loved it"}, None)])
    assert len(top1) == 1 and top1[0]["label"] == labels[int(np.argmax(want[0]))]
    [bad] = runner.responses_for_bodies([({"inputs": "x", "parameters": {"top_k": 0}}, None)])
    assert isinstance(bad, RequestError) and "top_k" in bad.message


def test_a_request_may_ask_for_its_own_truncation_from_either_end(runner, minilm_dir):
    import torch
    from transformers import AutoModel, AutoTokenizer

    long_text = " ".join(f"token{i}" for i in range(300))
    bodies = [
        ({"inputs": long_text}, None),  # the deployment's: truncation off
        ({"inputs": long_text, "parameters": {"truncate": True}}, None),
        ({"inputs": long_text, "parameters": {"truncate": True, "truncation_direction": "left"}},
         None),
    ]  # fmt: skip
    refused, right, left = runner.responses_for_bodies(bodies)
    assert isinstance(refused, RequestError) and refused.status == 413
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    model = AutoModel.from_pretrained(minilm_dir).eval()
    for side, got in (("right", right), ("left", left)):
        tok.truncation_side = side
        enc = tok(long_text, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            want = model(**enc).last_hidden_state.mean(1)[0].numpy()
        assert cosine(got, want) >= 0.9999, side
    assert cosine(right, left) < 0.999  # two different ends of the text


def test_too_many_texts_in_one_request_fail_alone(minilm_artifact, reference):
    limited = Runner(minilm_artifact, warmup=False, limits=RequestLimits(texts=3))
    report = RunReport()
    ok, too_many = limited.responses_for_bodies(
        [({"inputs": SENTENCES[:3]}, None), ({"inputs": SENTENCES[:4]}, None)], report
    )
    assert isinstance(too_many, RequestError) and too_many.status == 413
    assert "at most 3 (max_client_batch)" in too_many.message
    assert report.texts == 3  # refused before anything of it was tokenized
    assert all(cosine(ok[i], reference[i]) >= 0.9999 for i in range(3))


def test_an_over_long_text_and_a_deep_body_fail_alone(minilm_artifact, reference):
    """A 200 KB text and a body nested past Python's recursion limit (which used to raise
    RecursionError and take the whole batch down with a 503) are each a 413 naming the
    limit; the request between them is answered."""
    limited = Runner(minilm_artifact, warmup=False, limits=RequestLimits(chars=1000))
    report = RunReport()
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    shallow_but_over = {"inputs": "a", "parameters": {"x": json.loads("[" * 40 + "]" * 40)}}
    long_text, ok, too_deep, nested = limited.responses_for_bodies(
        [
            ({"inputs": "a" * 200_000}, None),
            ({"inputs": SENTENCES[:2]}, None),
            (deep, "application/json"),
            (json.dumps(shallow_but_over).encode(), "application/json"),
        ],
        report,
    )
    assert isinstance(long_text, RequestError) and long_text.status == 413
    assert "200000 characters" in long_text.message and "max_text_chars" in long_text.message
    for err in (too_deep, nested):
        assert isinstance(err, RequestError) and err.status == 413
        assert "max_json_depth" in err.message
    assert report.texts == 2  # only the good request reached the tokenizer
    assert all(cosine(ok[i], reference[i]) >= 0.9999 for i in range(2))
    # the default depth (32) leaves ordinary bodies alone, pairs included
    plain = Runner(minilm_artifact, warmup=False)
    assert plain.parse({"inputs": ["a", "b"], "parameters": {"truncate": True}}).texts
