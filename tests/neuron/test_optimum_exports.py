"""Models optimum-neuron already compiled, served as they are: exports made with the
stand-in SDK as `optimum-cli export neuron` writes them (tests/optimum_exports.py),
imported without a compile, loaded as the SDK loads them (torch.jit.load onto a
NeuronCore, which needs the device), and answering what the eager model answers."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from helpers import HUB_TEST_ID, compile_model, standin_events, standin_process
from optimum_exports import optimum_export

from neuronserve.artifact import read_manifest
from neuronserve.compile import CompileError
from neuronserve.spec import load_spec

TEXTS = ["a short one", "the second text is a little longer than the first", "x", "four", "5"]


def imported(tmp_path, export, target="neuronx", **fields):
    spec = load_spec(
        None,
        {
            "model": export,
            "artifact": tmp_path / "art",
            "target": target,
            "allow_exported_module": True,
            **fields,
        },
    )
    return compile_model(spec, progress=False)


def eager(model_dir, texts, kind="hidden"):
    """What the source model answers in transformers itself: every token's state and
    the mask, or the classifier's logits."""
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        if kind == "logits":
            return AutoModelForSequenceClassification.from_pretrained(model_dir)(**enc).logits
        return AutoModel.from_pretrained(model_dir)(**enc).last_hidden_state, enc["attention_mask"]


def mean_pooled(hidden, mask):
    m = mask.unsqueeze(-1).float()
    return ((hidden * m).sum(1) / m.sum(1)).numpy()


def embeddings(runner, texts, **parameters):
    body = {"inputs": texts, **({"parameters": parameters} if parameters else {})}
    [rows] = runner.outputs([runner.parse(body)])
    return np.asarray(rows)


def test_a_transformers_export_is_served_as_it_is(tmp_path, tiny_embedder_dir):
    log = tmp_path / "standin.jsonl"
    with standin_process(4, log=log):
        export = optimum_export(tmp_path / "export", tiny_embedder_dir, batch=2, seq=32)
        traced = len(standin_events(log, "trace"))
        art = imported(tmp_path, export)
        assert len(standin_events(log, "trace")) == traced  # nothing compiled again
        m = read_manifest(art)
        assert (m.target, m.batch_sizes, m.sequence_lengths) == ("neuronx", [2], [32])
        assert m.validation_status == "imported" and "optimum-neuron" in m.validation_note
        assert m.modules == {"b2_s32": "model.neuron"} and m.pooling == "cls"
        assert [i.name for i in m.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
        from neuronserve.runtime import Runner

        runner = Runner(art)
        got = embeddings(runner, TEXTS)
    hidden, _ = eager(tiny_embedder_dir, TEXTS)
    # the export's first answer, every token's state, pooled on the host: its first token
    want = hidden[:, 0].numpy()  # no Normalize module: as it is (a compile answers the same)
    assert got.shape == want.shape and np.allclose(got, want, atol=1e-4)
    # five texts through the one compiled batch of two: three calls, each 2 x 32
    calls = [e["shapes"] for e in standin_events(log, "execute")][-3:]
    assert all(s[0] == [2, 32] for s in calls)


def test_a_sentence_transformers_export_pools_as_its_modules_say(tmp_path, tiny_embedder_dir):
    with standin_process(4):
        export = optimum_export(
            tmp_path / "export", tiny_embedder_dir, kind="sentence-transformers", batch=4
        )
        art = imported(tmp_path, export)
        m = read_manifest(art)
        assert (m.pooling, m.normalize) == ("mean", True)
        assert [i.name for i in m.inputs] == ["input_ids", "attention_mask"]
        from neuronserve.runtime import Runner

        runner = Runner(art)
        normalised, raw = embeddings(runner, TEXTS), embeddings(runner, TEXTS, normalize=False)
    want = mean_pooled(*eager(tiny_embedder_dir, TEXTS))
    assert np.allclose(raw, want, atol=1e-4)  # normalize: false, as TEI answers it
    assert np.allclose(normalised, want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-4)


def test_a_classifier_export_answers_its_labels(tmp_path, classifier_dir):
    with standin_process(4):
        export = optimum_export(tmp_path / "export", classifier_dir, kind="classifier", batch=1)
        art = imported(tmp_path, export)
        m = read_manifest(art)
        assert m.task == "text-classification"
        assert m.labels == ["negative", "neutral", "positive"]
        from neuronserve.runtime import Runner

        runner = Runner(art)
        [rows] = runner.outputs([runner.parse({"inputs": TEXTS})])
    assert np.allclose(np.asarray(rows), eager(classifier_dir, TEXTS, "logits").numpy(), atol=1e-4)


def test_a_dynamic_batch_export_serves_multiples_of_its_batch(tmp_path, tiny_embedder_dir):
    with standin_process(4):
        export = optimum_export(tmp_path / "export", tiny_embedder_dir, batch=2, dynamic=True)
        m = read_manifest(imported(tmp_path, export))
    assert m.batch_sizes == [2, 4, 8, 16] and set(m.modules.values()) == {"model.neuron"}


def test_an_export_for_another_target_or_a_newer_compiler_says_what_to_do(
    tmp_path, tiny_embedder_dir, monkeypatch
):
    with standin_process(4):
        export = optimum_export(tmp_path / "export", tiny_embedder_dir, source=HUB_TEST_ID)
        with pytest.raises(CompileError) as e:
            imported(tmp_path, export, target="cpu")
        said = str(e.value)
        assert "compiled by neuronx-cc 2.18.0.0 for Inf2/Trn1" in said
        assert "serve it on an Inf2/Trn1 host" in said and "--recompile" in said
        assert HUB_TEST_ID in said
        monkeypatch.setenv("NEURON_STANDIN_NEURONXCC", "2.17.5.0")
        with pytest.raises(CompileError, match=r"newer than this host's 2\.17\.5\.0: install"):
            imported(tmp_path, export)
        monkeypatch.setenv("NEURON_STANDIN_NEURONXCC", "3.0.1.0")
        monkeypatch.delitem(sys.modules, "neuronxcc")  # a host with another SDK
        with pytest.raises(CompileError, match=r"another major version than this host's 3\.0"):
            imported(tmp_path, export)
        monkeypatch.setenv("NEURON_STANDIN_NEURONXCC", "2.19.0.0")
        inf1 = optimum_export(tmp_path / "inf1", tiny_embedder_dir, compiler="neuron-cc")
        with pytest.raises(CompileError, match=r"for Inf1 .* serve it on an Inf1 host"):
            imported(tmp_path, inf1)
    assert not (tmp_path / "art").exists()  # nothing half-written


def test_recompile_compiles_the_source_model_over_the_grid(
    tmp_path, tiny_embedder_dir, offline_hub
):
    with standin_process(4):
        export = optimum_export(tmp_path / "export", tiny_embedder_dir, source=HUB_TEST_ID)
    with standin_process(4):  # a compile pins its core before the SDK is imported
        art = imported(
            tmp_path, export, recompile=True, batch_sizes=[1, 4], sequence_lengths=[16],
            precision="fp32",
        )  # fmt: skip
        m = read_manifest(art)
    assert m.validation_status == "passed" and m.exported is None
    assert (m.batch_sizes, m.sequence_lengths) == ([1, 4], [16])
    assert set(m.modules.values()) == {"b1_s16.pt", "b4_s16.pt"}


def test_validate_says_an_export_has_no_reference_here(tmp_path, tiny_embedder_dir):
    from neuronserve.compile.check import validate_artifact

    with standin_process(4):
        art = imported(tmp_path, optimum_export(tmp_path / "export", tiny_embedder_dir))
        with pytest.raises(CompileError, match=r"no eager reference .* --recompile"):
            validate_artifact(art)
    assert json.loads((art / "manifest.json").read_text())["validation_status"] == "imported"
