"""CPU precisions: every compile measures its accuracy against fp32 eager, a precision
under the spec's floor is refused, and `auto` keeps the fastest one that passes."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from helpers import SENTENCES, compile_model, cosine, eager_classifier_scores, reference_embeddings

from neuronserve.compile import CompileError, openvino
from neuronserve.compile.cpu import native_bf16
from neuronserve.compile.driver import describe
from neuronserve.compile.texts import accuracy_texts, calibration_texts
from neuronserve.runtime import Runner
from neuronserve.spec import SpecError, load_spec
from neuronserve.tokenization import TextTokenizer

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
    # int8 is too lossy for MiniLM embeddings: ONNX Runtime's dynamic int8 and OpenVINO's
    # static, calibrated one both miss 0.999 (worst on one-word texts: ~0.77 and ~0.72)
    with pytest.raises(
        CompileError,
        match=r"precision int8 refused: min_cosine 0\.\d+ .* "
        r"under min_cosine 0\.999",
    ) as e:
        compile_model(_spec(minilm_dir, tmp_path / "int8", precision="int8"), progress=False)
    assert "lower `min_cosine` explicitly" in str(e.value)
    assert "(onnx)" in str(e.value) and "(openvino)" in str(e.value)
    assert not (tmp_path / "int8").exists()


@pytest.mark.parametrize("module_format,suffix", [("onnx", ".onnx"), ("openvino", ".openvino")])
def test_a_lowered_floor_accepts_int8_and_records_its_accuracy(
    tmp_path, classifier_dir, module_format, suffix
):
    out = compile_model(
        _spec(
            classifier_dir,
            tmp_path / "int8",
            task="text-classification",
            precision="int8",
            module_format=module_format,
            min_argmax_agreement=0.5,
        ),
        progress=False,
    )
    m = json.loads((out / "manifest.json").read_text())
    assert (m["precision"], m["compiler"]["module_format"]) == ("int8", module_format)
    assert [t["module_format"] for t in m["precision_trials"]] == [module_format]
    assert m["modules"] == {"dynamic": "model" + suffix}
    assert m["accuracy_floor"] == {"min_argmax_agreement": 0.5}
    assert 0.5 <= m["accuracy"]["argmax_agreement"] <= 1.0
    assert m["accuracy"]["texts"] >= 90 and m["accuracy"]["max_abs_diff"] > 0
    if module_format == "openvino":
        with zipfile.ZipFile(out / "model.openvino") as z:
            ir = z.read("model.xml").decode()
        # static quantisation: activation ranges fixed at compile (FakeQuantize with
        # calibrated constants) before the matrix products, not measured per request
        assert ir.count('type="FakeQuantize"') >= 4
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
        (p, f)
        for p in ("int8", "bf16", "fp32")
        for f in ("torchscript", "onnx", "openvino")
        if (p, f) not in {("int8", "torchscript"), ("bf16", "onnx")}
    }
    passed = {p: t for p, t in trials.items() if t["passed"]}
    assert {("fp32", "torchscript"), ("fp32", "onnx"), ("fp32", "openvino")} <= set(passed)
    # bf16 is built only where the CPU runs it natively (OpenVINO would run f32 under its
    # name, torch would emulate it slower than fp32), and each says so if not
    bf16_ov, bf16_torch = trials[("bf16", "openvino")], trials[("bf16", "torchscript")]
    assert bf16_ov["accuracy"] or "no native bf16" in bf16_ov["reason"]
    if native_bf16():
        assert bf16_torch["accuracy"], bf16_torch
    else:
        assert not bf16_torch["accuracy"] and "no native bf16" in bf16_torch["reason"]
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


def test_fp32_is_built_three_ways_and_the_fastest_is_kept(tmp_path, minilm_dir):
    out = compile_model(_spec(minilm_dir, tmp_path / "fp32", precision="fp32"), progress=False)
    m = json.loads((out / "manifest.json").read_text())
    trials = {t["module_format"]: t for t in m["precision_trials"]}
    # TorchScript, ONNX Runtime (fused operators) and OpenVINO (asked for f32: its default
    # is bf16 on a bf16 CPU) all run fp32, all held to fp32's tolerance against eager
    assert set(trials) == {"torchscript", "onnx", "openvino"}
    assert all(t["passed"] for t in trials.values())
    assert all(t["precision"] == "fp32" and t["batch1_ms"] > 0 for t in trials.values())
    kept = m["compiler"]["module_format"]
    assert trials[kept]["batch1_ms"] == min(t["batch1_ms"] for t in trials.values())
    suffix = {"onnx": ".onnx", "torchscript": ".pt", "openvino": ".openvino"}[kept]
    assert m["modules"] == {"dynamic": "model" + suffix}
    assert all(v["max_abs_diff"] <= m["tolerance"] for v in m["validation"])
    # served: equal to eager at fp32's tolerance, whichever library runs it
    runner = Runner(out)
    got = np.array([runner.responses([runner.parse({"inputs": t})])[0] for t in TEXTS])
    assert np.abs(got - reference_embeddings(minilm_dir, TEXTS)).max() < 1e-4


def test_openvino_bf16_serves_embeddings_within_the_floor(tmp_path, minilm_dir):
    spec = _spec(minilm_dir, tmp_path / "ov", precision="bf16", module_format="openvino")
    why = openvino.unavailable("bf16")
    if why:  # a CPU without native bf16: refused with the reason, nothing written
        with pytest.raises(CompileError, match=r"cannot be built here: .*no native bf16"):
            compile_model(spec, progress=False)
        return
    out = compile_model(spec, progress=False)
    runner = Runner(out)
    m = runner.manifest
    assert (m.precision, m.compiler["module_format"]) == ("bf16", "openvino")
    assert m.modules == {"dynamic": "model.openvino"} and m.accuracy["min_cosine"] >= 0.999
    got = np.array([runner.responses([runner.parse({"inputs": t})])[0] for t in TEXTS])
    want = reference_embeddings(minilm_dir, TEXTS)
    sims = [cosine(a, b) for a, b in zip(got, want, strict=True)]
    # close to transformers' own embeddings, and really bf16 (OpenVINO's default on such
    # a CPU), not fp32 under another name
    assert min(sims) >= 0.999 and min(sims) < 1 - 1e-7


def test_calibration_texts_are_not_the_texts_accuracy_is_judged_on():
    judged, calibrated = accuracy_texts(), calibration_texts()
    assert len(calibrated) >= 32 and not set(judged) & set(calibrated)
    assert len({len(t.split()) for t in calibrated}) > 10  # short and long alike


def test_accuracy_is_judged_on_one_word_queries_and_long_passages(minilm_dir):
    # mean pooling over a few tokens averages no error out: a build that keeps long texts
    # can lose short ones, so the judge holds both
    tokenizer = TextTokenizer(minilm_dir / "tokenizer.json", 512)
    lengths = [len(e.ids) for e in tokenizer.encode(accuracy_texts(), truncate=False)]
    assert len(lengths) == len(set(accuracy_texts())) == 96
    assert sum(n <= 4 for n in lengths) >= 8  # [CLS] one or two tokens [SEP]
    assert max(lengths) >= 64


def test_a_module_format_keeps_only_its_builds(tmp_path, classifier_dir):
    out = compile_model(
        _spec(
            classifier_dir,
            tmp_path / "ts",
            task="text-classification",
            precision="fp32",
            module_format="torchscript",
        ),
        progress=False,
    )
    m = json.loads((out / "manifest.json").read_text())
    assert [(t["precision"], t["module_format"]) for t in m["precision_trials"]] == [
        ("fp32", "torchscript")
    ]
    assert m["modules"] == {"dynamic": "model.pt"}
    with pytest.raises(CompileError, match="module_format onnx has no bf16 build"):
        compile_model(
            _spec(classifier_dir, tmp_path / "x", precision="bf16", module_format="onnx"),
            progress=False,
        )
    with pytest.raises(SpecError, match="module_format openvino applies to target cpu"):
        load_spec(None, {"target": "neuronx", "module_format": "openvino"})


def test_a_build_this_host_cannot_make_is_refused_and_the_others_tried(
    tmp_path, classifier_dir, monkeypatch
):
    monkeypatch.setattr(openvino, "unavailable", lambda p: "OpenVINO is not installed (test)")
    out = compile_model(
        _spec(classifier_dir, tmp_path / "auto", task="text-classification"), progress=False
    )
    m = json.loads((out / "manifest.json").read_text())
    ov = [t for t in m["precision_trials"] if t["module_format"] == "openvino"]
    assert len(ov) == 3
    assert all(not t["passed"] and t["reason"] == "OpenVINO is not installed (test)" for t in ov)
    assert (
        m["compiler"]["module_format"] != "openvino" and m["accuracy"]["argmax_agreement"] >= 0.99
    )
    assert "OpenVINO is not installed (test)" in describe(out)
    with pytest.raises(
        CompileError, match=r"precision fp32 cannot be built here: OpenVINO is not installed"
    ):
        compile_model(
            _spec(classifier_dir, tmp_path / "x", precision="fp32", module_format="openvino"),
            progress=False,
        )
