"""CPU precisions: every compile measures its accuracy against fp32 eager, a precision
under the spec's floor is refused, and `auto` keeps the fastest one that passes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import SENTENCES, cosine, eager_classifier_scores, reference_embeddings

from neuronserve.compile import CompileError, compile_model
from neuronserve.runtime import Runner
from neuronserve.spec import SpecError, load_spec

TEXTS = [t for t in SENTENCES if t.strip() and len(t) < 200] + [
    "Inferentia runs compiled graphs.",
    "Cosine similarity ranks the documents.",
]


def _spec(model, out, **kw):
    return load_spec(
        None,
        {
            "model": model,
            "artifact": out,
            "batch_sizes": [1, 4],
            "sequence_lengths": [16, 64],
            **kw,
        },
    )


def test_int8_embeddings_under_the_cosine_floor_are_refused(tmp_path, minilm_dir):
    # dynamic int8 is too lossy for MiniLM embeddings (cosine ~0.9 on some texts)
    with pytest.raises(
        CompileError,
        match=r"precision int8 refused: min_cosine 0\.\d+ .* "
        r"under min_cosine 0\.999",
    ) as e:
        compile_model(_spec(minilm_dir, tmp_path / "int8", precision="int8"), progress=False)
    assert "lower `min_cosine` explicitly" in str(e.value)
    assert not (tmp_path / "int8").exists()


def test_a_lowered_floor_accepts_int8_and_records_its_accuracy(tmp_path, classifier_dir):
    out = compile_model(
        _spec(
            classifier_dir,
            tmp_path / "int8",
            task="text-classification",
            precision="int8",
            min_argmax_agreement=0.5,
        ),
        progress=False,
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["precision"] == "int8" and m["compiler"]["module_format"] == "onnx"
    assert m["modules"] == {"dynamic": "model.onnx"}
    assert m["accuracy_floor"] == {"min_argmax_agreement": 0.5}
    assert 0.5 <= m["accuracy"]["argmax_agreement"] <= 1.0
    assert m["accuracy"]["texts"] >= 90 and m["accuracy"]["max_abs_diff"] > 0
    # what the manifest says is what the served model does
    runner = Runner(out)
    got = np.array([r[0] for t in TEXTS for r in runner.outputs([runner.parse({"inputs": [t]})])])
    want = eager_classifier_scores(classifier_dir, TEXTS)
    probs = np.exp(got) / np.exp(got).sum(1, keepdims=True)
    assert np.abs(probs - want).max() < 0.05
    assert np.abs(probs - want).max() > 1e-6  # really int8, not fp32 under another name


def test_auto_keeps_the_fastest_precision_that_passes(tmp_path, classifier_dir):
    out = compile_model(
        _spec(classifier_dir, tmp_path / "auto", task="text-classification"), progress=False
    )
    m = json.loads((out / "manifest.json").read_text())
    trials = {(t["precision"], t["module_format"]): t for t in m["precision_trials"]}
    assert set(trials) == {
        ("int8", "onnx"),
        ("bf16", "torchscript"),
        ("fp32", "torchscript"),
        ("fp32", "onnx"),
    }
    passed = {p: t for p, t in trials.items() if t["passed"]}
    assert ("fp32", "torchscript") in passed and ("fp32", "onnx") in passed
    kept = (m["precision"], m["compiler"]["module_format"])
    assert kept == min(passed, key=lambda p: passed[p]["batch1_ms"])
    assert m["accuracy"] == trials[kept]["accuracy"]
    assert m["accuracy"]["argmax_agreement"] >= 0.99
    # served labels agree with the fp32 eager model
    runner = Runner(out)
    logits = np.concatenate([runner.outputs([runner.parse({"inputs": [t]})])[0] for t in TEXTS])
    want = eager_classifier_scores(classifier_dir, TEXTS)
    assert (logits.argmax(1) == want.argmax(1)).mean() >= 0.99


def test_bf16_serves_embeddings_within_the_floor(tmp_path, minilm_dir):
    out = compile_model(_spec(minilm_dir, tmp_path / "bf16", precision="bf16"), progress=False)
    runner = Runner(out)
    assert runner.manifest.precision == "bf16" and runner.manifest.accuracy["min_cosine"] >= 0.999
    got = np.array([runner.responses([runner.parse({"inputs": t})])[0] for t in TEXTS])
    want = reference_embeddings(minilm_dir, TEXTS)
    sims = [cosine(a, b) for a, b in zip(got, want, strict=True)]
    assert min(sims) >= 0.999 and min(sims) < 1 - 1e-7  # close, and not fp32 in disguise


def test_precision_errors_name_what_the_target_has(tmp_path, classifier_dir):
    with pytest.raises(CompileError, match="target cpu has no precision 'fp16'"):
        compile_model(
            _spec(classifier_dir, tmp_path / "x", task="text-classification", precision="fp16"),
            progress=False,
        )
    with pytest.raises(SpecError, match="min_cosine"):
        load_spec(None, {"min_cosine": 1.5})


def test_fp32_is_built_both_ways_and_the_faster_is_kept(tmp_path, minilm_dir):
    out = compile_model(_spec(minilm_dir, tmp_path / "fp32", precision="fp32"), progress=False)
    m = json.loads((out / "manifest.json").read_text())
    trials = {t["module_format"]: t for t in m["precision_trials"]}
    # TorchScript and ONNX Runtime (fused operators) both run fp32, both held to fp32's
    # tolerance against eager, each timed
    assert set(trials) == {"torchscript", "onnx"} and all(t["passed"] for t in trials.values())
    assert all(t["precision"] == "fp32" and t["batch1_ms"] > 0 for t in trials.values())
    kept = m["compiler"]["module_format"]
    assert trials[kept]["batch1_ms"] == min(t["batch1_ms"] for t in trials.values())
    assert m["modules"] == {"dynamic": "model.onnx" if kept == "onnx" else "model.pt"}
    assert all(v["max_abs_diff"] <= m["tolerance"] for v in m["validation"])
    # served: equal to eager at fp32's tolerance, whichever library runs it
    runner = Runner(out)
    got = np.array([runner.responses([runner.parse({"inputs": t})])[0] for t in TEXTS])
    assert np.abs(got - reference_embeddings(minilm_dir, TEXTS)).max() < 1e-4
