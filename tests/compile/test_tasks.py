"""The encoder tasks beyond embeddings and classification, served through the Runner (the
one pad-run-unpad path every server uses) on tiny random-weight models compiled for the
CPU, against the transformers pipelines on the eager model (question answering against
the 4.x pipeline's algorithm written out, since transformers 5 removed it)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import (
    ARCHITECTURES,
    compile_artifact,
    qa_reference,
    same_answers,
    through_the_wire,
    tiny_model,
)

from neuronserve import tensors
from neuronserve.execution import RunReport
from neuronserve.runtime import Runner
from neuronserve.tasks import RequestError

# unicode, emoji, one character, accents, a long text (more than the 32-token bucket)
TEXTS = [
    "Ana met Bob in Paris last week",
    "naïve café 🎉 in Zürich, said Ana.",
    "a",
    "東京 and Москва are far from São Paulo!",
    "The quick brown fox jumps over the lazy dog near New York and then runs back home",
]


def _model(tmp_path_factory, minilm_dir, task: str, arch: str = "bert", **config):
    return _built(tmp_path_factory, minilm_dir, task, arch, None, **config)


# what differs by architecture is the model and its tokenizer, not the bucket grid
ONE_BUCKET = {"module_format": "torchscript", "batch_sizes": [4], "sequence_lengths": [32]}


def _built(tmp_path_factory, minilm_dir, task: str, arch: str, fields, **config):
    root = tmp_path_factory.mktemp(f"{task}-{arch}")
    model = tiny_model(
        root / "model", minilm_dir, task, arch, seed=3, initializer_range=0.5, **config
    )
    return model, compile_artifact(root / "artifact", model, task, **(fields or {}))


def _answer(runner: Runner, body: dict):
    out = runner.responses_for_bodies([(json.dumps(body), "application/json")])[0]
    if isinstance(out, RequestError):
        raise out
    return out


@pytest.fixture(scope="module")
def ner(tmp_path_factory, minilm_dir):
    model, artifact = _model(tmp_path_factory, minilm_dir, "token-classification")
    return model, Runner(artifact)


@pytest.fixture(scope="module")
def qa(tmp_path_factory, minilm_dir):
    model, artifact = _model(tmp_path_factory, minilm_dir, "question-answering")
    return model, Runner(artifact)


@pytest.fixture(scope="module")
def fill(tmp_path_factory, minilm_dir):
    model, artifact = _model(tmp_path_factory, minilm_dir, "fill-mask")
    return model, Runner(artifact)


@pytest.fixture(scope="module")
def rerank(tmp_path_factory, minilm_dir):
    model, artifact = _model(tmp_path_factory, minilm_dir, "rerank")
    return model, Runner(artifact)


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_entities_equal_the_pipeline(ner, strategy):
    from transformers import pipeline

    model, runner = ner
    short = TEXTS[:4]  # the pipeline would keep the long one whole; truncation off here
    got = _answer(runner, {"inputs": short, "parameters": {"aggregation_strategy": strategy}})
    want = pipeline("token-classification", model=str(model))(short, aggregation_strategy=strategy)
    assert any(got), "the random model found no entity: the comparison would be empty"
    assert same_answers(got, want)
    # one text in, one list of entities out
    one = _answer(runner, {"inputs": short[1], "parameters": {"aggregation_strategy": strategy}})
    assert same_answers(one, want[1])


def test_entities_of_cut_text_keep_offsets_into_the_text_sent(ner):
    from transformers import pipeline

    model, runner = ner
    text = "Ünïcode 🎉 " + TEXTS[4] + " " + TEXTS[3]  # 49 tokens: cut to 32 on request
    assert len(runner.tokenizer.encode([text], False)[0].ids) > 32
    pipe = pipeline("token-classification", model=str(model))
    pipe.tokenizer.model_max_length = 32  # the pipeline truncates at this length
    for strategy in ("none", "first"):
        params = {"aggregation_strategy": strategy, "truncate": True}
        got = _answer(runner, {"inputs": text, "parameters": params})
        assert same_answers(got, pipe(text, aggregation_strategy=strategy))
        assert max(e["end"] for e in got) < text.index("Paulo")  # the cut dropped the end
    with pytest.raises(RequestError) as refused:  # not asked to cut: refused, not cut
        _answer(runner, {"inputs": text})
    assert refused.value.status == 413


@pytest.mark.parametrize("arch", sorted(set(ARCHITECTURES) - {"bert"}))
def test_every_architecture_serves_every_text_task(tmp_path_factory, minilm_dir, arch):
    """Each architecture compiles for token classification, question answering, fill-mask
    and rerank, and its answers equal the reference's (the pipelines; the QA algorithm
    written out; the eager cross-encoder's scores). TorchScript only: what differs by
    architecture is the model and its tokenizer, and fp32's three builds are tested on
    BERT (tests/compile/test_precision.py)."""
    from transformers import pipeline

    def build(task: str):
        return _built(tmp_path_factory, minilm_dir, task, arch, ONE_BUCKET)

    model, artifact = build("token-classification")
    got = _answer(
        Runner(artifact), {"inputs": TEXTS[:4], "parameters": {"aggregation_strategy": "simple"}}
    )
    want = pipeline("token-classification", model=str(model))(
        TEXTS[:4], aggregation_strategy="simple"
    )
    assert same_answers(got, want)
    model, artifact = build("question-answering")
    question, context = "Who went to Paris?", " ".join(TEXTS)
    got = _answer(
        Runner(artifact), {"question": question, "context": context, "parameters": {"top_k": 2}}
    )
    assert same_answers(got, qa_reference(model, question, context, 32, top_k=2))
    model, artifact = build("fill-mask")
    masked = ["Ana met [MASK] in Paris.", "naïve [MASK] 🎉 and [MASK]"]
    got = _answer(Runner(artifact), {"inputs": masked, "parameters": {"top_k": 3}})
    assert same_answers(got, pipeline("fill-mask", model=str(model))(masked, top_k=3))
    model, artifact = build("rerank")
    want = _eager_pair_scores(model, "where?", TEXTS)
    got = _answer(Runner(artifact), {"query": "where?", "documents": TEXTS})
    assert [g["index"] for g in got] == sorted(range(len(TEXTS)), key=lambda i: -want[i])
    assert all(abs(g["score"] - want[g["index"]]) < 1e-4 for g in got)


@pytest.mark.parametrize(
    "arch,task",
    [("bert", "image-classification"), ("vit", "token-classification"), ("vit", "fill-mask")],
)
def test_a_combination_without_a_head_fails_at_compile_naming_it(tmp_path, minilm_dir, arch, task):
    from helpers import tiny_vit

    from neuronserve.compile import CompileError

    model = (
        tiny_vit(tmp_path / "m", "image-feature-extraction")
        if arch == "vit"
        else tiny_model(tmp_path / "m", minilm_dir, "feature-extraction")
    )
    with pytest.raises(CompileError) as e:
        compile_artifact(tmp_path / "art", model, task)
    assert arch in str(e.value) and task in str(e.value) and "cannot be compiled" in str(e.value)
    assert not (tmp_path / "art").exists()


@pytest.mark.parametrize(
    "which,metric,floor",
    [
        ("ner", "token_argmax_agreement", "min_argmax_agreement"),
        ("qa", "span_agreement", "min_span_agreement"),
        ("fill", "top1_agreement", "min_top1_agreement"),
        ("rerank", "spearman", "min_spearman"),
    ],
)
def test_each_task_records_its_own_accuracy_measure(request, which, metric, floor):
    manifest = request.getfixturevalue(which)[1].manifest
    assert manifest.accuracy[metric] == 1.0  # fp32 against fp32 eager
    assert list(manifest.accuracy_floor) == [floor]
    assert manifest.precision_trials[0].accuracy[metric] == 1.0


def test_answers_equal_the_qa_pipelines_across_windows(qa):
    model, runner = qa
    context = " ".join(TEXTS) + " " + " ".join(TEXTS[::-1])  # about 90 tokens: 5+ windows
    cases = [
        ("Where did Ana meet Bob?", {}),
        ("Who?", {"top_k": 3, "max_answer_len": 4}),
        ("Is it far?", {"handle_impossible_answer": True, "top_k": 2}),
        ("Is it far?", {"doc_stride": 4}),
    ]
    for question, params in cases:
        got = _answer(runner, {"question": question, "context": context, "parameters": params})
        assert same_answers(got, qa_reference(model, question, context, 32, **params)), params
    # a batch of questions, the HF inference API's shape; a one-character context
    items = [{"question": "Who?", "context": TEXTS[1]}, {"question": "What?", "context": "a"}]
    got = _answer(runner, {"inputs": items})
    assert same_answers(got, [qa_reference(model, i["question"], i["context"], 32) for i in items])


def test_a_doc_stride_the_tokenizer_cannot_take_fails_alone(qa):
    """A stride as long as a window's room for context (the Rust tokenizer panics on it,
    which Python sees as a BaseException) is that request's 413; its neighbour answers."""
    model, runner = qa
    context = " ".join(TEXTS)
    bodies = [
        {"question": "Who?", "context": context, "parameters": {"doc_stride": 31}},
        {"question": "Who?", "context": context},
    ]
    refused, answered = runner.responses_for_bodies(
        [(json.dumps(b), "application/json") for b in bodies]
    )
    assert isinstance(refused, RequestError) and refused.status == 413, refused
    assert "doc_stride" in str(refused)
    assert same_answers(answered, qa_reference(model, "Who?", context, 32))


def test_a_long_context_runs_as_windows_across_buckets(qa):
    _, runner = qa
    from neuronserve.tasks import get_task

    request = get_task("question-answering").parse(
        {"question": "Who?", "context": " ".join(TEXTS * 3)}, {}
    )
    report = RunReport()
    runner.outputs([request], report)
    assert sum(r.rows for r in report.runs) >= 6  # one row per window
    assert len(report.runs) >= 2  # more windows than the largest batch: several runs


def test_fill_mask_equals_the_pipeline(fill):
    from transformers import pipeline

    model, runner = fill
    pipe = pipeline("fill-mask", model=str(model))
    for inputs, params in (
        ("Ana met [MASK] in Paris.", {}),
        (["naïve café 🎉 [MASK]!", "[MASK]"], {"top_k": 3}),
        ("Two masks: [MASK] and [MASK] 東京.", {"top_k": 10}),  # a list per mask
    ):
        got = _answer(runner, {"inputs": inputs, "parameters": params})
        assert same_answers(got, pipe(inputs, **params)), inputs


def test_fill_mask_refusals_fail_alone(fill):
    _, runner = fill
    bodies = [
        {"inputs": "Ana met [MASK]."},
        {"inputs": "no mask here"},
        {"inputs": "[MASK] again", "parameters": {"top_k": 11}},  # compiled for 10
        {"inputs": "[MASK]", "parameters": {"top_k": "five"}},
        {"inputs": "and [MASK] here"},
    ]
    out = runner.responses_for_bodies([(json.dumps(b), None) for b in bodies])
    assert isinstance(out[1], RequestError) and "no mask token" in out[1].message
    assert isinstance(out[2], RequestError) and "max_top_k" in out[2].message
    assert isinstance(out[3], RequestError) and "top_k" in out[3].message
    assert all(e.status == 400 for e in out[1:4])
    for i in (0, 4):
        assert out[i] == runner.responses_for_bodies([(json.dumps(bodies[i]), None)])[0]


def _eager_pair_scores(model_dir, query, documents):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    scores = []
    for d in documents:
        with torch.no_grad():
            logits = model(**tok(query, d, return_tensors="pt")).logits[0]
        scores.append(float(torch.sigmoid(logits[0])))
    return scores


def test_rerank_sorts_every_document_by_the_eager_score(rerank):
    model, runner = rerank
    query, documents = "where is Paris?", TEXTS[:4] * 3  # 12 pairs: three full buckets
    want = _eager_pair_scores(model, query, documents)
    report = RunReport()
    request = runner.parse({"query": query, "documents": documents})
    got = runner.task.respond(runner.outputs([request], report)[0], request, runner.info)
    assert [g["index"] for g in got] == sorted(range(12), key=lambda i: -want[i])
    assert all(abs(g["score"] - want[g["index"]]) < 1e-4 for g in got)
    assert sum(r.rows for r in report.runs) == 12 and len(report.runs) >= 3
    top = _answer(
        runner,
        {
            "query": query,
            "documents": documents,
            "parameters": {"top_n": 2, "return_documents": True},
        },
    )
    assert [t["index"] for t in top] == [g["index"] for g in got[:2]]
    assert [t["document"] for t in top] == [documents[t["index"]] for t in top]


def test_rerank_refusals(rerank):
    _, runner = rerank
    for body, words in (
        ({"query": "q", "documents": []}, "empty"),
        ({"query": "q"}, "documents"),
        ({"query": "q", "documents": "one"}, "list"),
        ({"query": 3, "documents": ["a"]}, "query"),
        ({"query": "q", "documents": ["a", 7]}, "documents[1]"),
        ({"query": "q", "documents": ["a"], "parameters": {"top_n": 0}}, "top_n"),
    ):
        out = runner.responses_for_bodies([(json.dumps(body), None)])[0]
        assert isinstance(out, RequestError) and out.status == 400 and words in out.message, body


def test_rerank_with_several_labels_scores_the_named_one(tmp_path_factory, minilm_dir):
    from neuronserve.compile import CompileError

    root = tmp_path_factory.mktemp("rerank-labels")
    labels = {0: "irrelevant", 1: "relevant"}
    model = tiny_model(root / "model", minilm_dir, "rerank", num_labels=2, id2label=labels)
    with pytest.raises((CompileError, ValueError), match="relevance_label"):
        compile_artifact(root / "unnamed", model, "rerank")
    runner = Runner(compile_artifact(root / "art", model, "rerank", relevance_label="relevant"))
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    eager = AutoModelForSequenceClassification.from_pretrained(model).eval()
    with torch.no_grad():
        probs = eager(
            **tok(["q"] * 2, TEXTS[:2], return_tensors="pt", padding=True)
        ).logits.softmax(-1)
    got = _answer(runner, {"query": "q", "documents": TEXTS[:2]})
    assert {g["index"]: g["score"] for g in got} == pytest.approx(
        {i: float(probs[i, 1]) for i in range(2)}, abs=1e-4
    )


@pytest.mark.parametrize("which", ["ner", "qa", "fill", "rerank"])
def test_triton_tensors_carry_the_same_answers(request, which):
    """What a Triton instance sends is the task's tensors, and what a worker sends the
    front (its answer frame, read back, then answered) is the answer the Runner gives in
    process."""
    _, runner = request.getfixturevalue(which)
    task = runner.task
    codec = tensors.of(task.name)
    body = {
        "ner": {"inputs": TEXTS[:3], "parameters": {"aggregation_strategy": "average"}},
        "qa": {"inputs": [{"question": "Who?", "context": t} for t in TEXTS[:3]]},
        "fill": {"inputs": ["[MASK] and [MASK]", "a [MASK]"], "parameters": {"top_k": 2}},
        "rerank": {"query": "q", "documents": TEXTS},
    }[which]
    parsed = runner.parse(json.dumps(body))
    results = runner.outputs([parsed])[0]
    sent = runner.tensors(parsed, results)
    specs = codec.outputs(runner.manifest.output_dim, runner.manifest.labels)
    assert [s.name for s in specs] == list(sent)
    rebuilt = task.respond(through_the_wire(results), parsed, runner.manifest.task_info())
    assert same_answers(rebuilt, runner.responses([parsed])[0], atol=1e-6)


def test_bad_requests_fail_alone_in_a_mixed_batch(qa):
    _, runner = qa
    good = {"question": "Who?", "context": TEXTS[0]}
    bodies = [
        good,
        {"question": "Who?"},  # no context
        {"inputs": [{"question": "Who?", "context": 5}]},  # wrong type
        {"question": "Who?", "context": "  "},
        {"question": "Who?", "context": TEXTS[1], "parameters": {"top_k": "2"}},
        {"question": " ".join(["why"] * 40), "context": "a"},  # no room for the context
        good,
    ]
    out = runner.responses_for_bodies([(json.dumps(b), None) for b in bodies])
    for i in range(1, 6):
        assert isinstance(out[i], RequestError) and out[i].status in (400, 413), bodies[i]
    assert out[5].status == 413
    assert out[0] == out[6] and not isinstance(out[0], RequestError)


def test_auto_precision_is_judged_by_the_tasks_measure(tmp_path_factory, minilm_dir):
    from neuronserve.artifact import read_manifest

    root = tmp_path_factory.mktemp("ner-auto")
    model = tiny_model(root / "model", minilm_dir, "token-classification", seed=5)
    manifest = read_manifest(
        compile_artifact(root / "art", model, "token-classification", precision="auto")
    )
    assert manifest.accuracy_floor == {"min_argmax_agreement": 0.99}
    assert "token_argmax_agreement" in manifest.accuracy
    assert {t.precision for t in manifest.precision_trials} >= {"fp32", "int8"}
    # a build this CPU cannot run natively (OpenVINO's bf16 without AVX512-BF16 or AMX) is
    # refused unmeasured, saying why; every other is measured by the task's own measure
    measured = [t for t in manifest.precision_trials if t.accuracy]
    assert all(t.passed is False and t.reason for t in manifest.precision_trials
               if not t.accuracy)  # fmt: skip
    assert {t.precision for t in measured} >= {"fp32", "int8"}
    assert all("token_argmax_agreement" in t.accuracy for t in measured)
    for t in measured:  # refused exactly when under the floor
        assert t.passed == (t.precision == "fp32" or t.accuracy["token_argmax_agreement"] >= 0.99)
    assert np.isfinite(manifest.accuracy["token_argmax_agreement"])
