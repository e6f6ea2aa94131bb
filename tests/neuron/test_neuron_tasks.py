"""The new encoder tasks on the Neuron targets through the SDK stand-in: a module per
bucket traced the XLA way (static shapes, padded examples), answers per token unpadded
like on the CPU. Served answers equal those of the same model compiled for the CPU."""

from __future__ import annotations

import json

import pytest
from helpers import compile_artifact, same_answers, standin_process, tiny_model

from neuronserve.artifact import read_manifest
from neuronserve.runtime import Runner

BODIES = {
    "token-classification": {
        "inputs": ["Ana met Bob in Paris", "naïve café 🎉 in Zürich", "a"],
        "parameters": {"aggregation_strategy": "first"},
    },
    "question-answering": {
        "question": "Who met Bob?",
        "context": "Ana met Bob in Paris last week, then they took a train to Zürich and "
        "walked by the lake for an hour before dinner at a small café 🎉 near the station",
        "parameters": {"top_k": 2},
    },
    "fill-mask": {"inputs": ["Ana met [MASK] in Paris", "[MASK] and [MASK]"]},
    "rerank": {"query": "where?", "documents": ["Paris", "a lake in Zürich", "x", "y", "z"]},
    # SPLADE: the max over tokens runs inside each bucket's module, padding masked
    "sparse-embedding": {"inputs": ["Ana met Bob in Paris", "a", "naïve café 🎉 in Zürich"]},
}


@pytest.mark.parametrize("task", sorted(BODIES))
def test_neuronx_answers_equal_the_cpu_build(tmp_path, minilm_dir, task):
    model = tiny_model(tmp_path / "model", minilm_dir, task, seed=7, initializer_range=0.5)
    cpu = Runner(compile_artifact(tmp_path / "cpu", model, task))
    with standin_process(4):
        artifact = compile_artifact(tmp_path / "neuronx", model, task, target="neuronx")
        manifest = read_manifest(artifact)
        assert sorted(manifest.modules) == ["b1_s16", "b1_s32", "b4_s16", "b4_s32"]
        got = Runner(artifact).responses_for_bodies([(json.dumps(BODIES[task]), None)])[0]
    want = cpu.responses_for_bodies([(json.dumps(BODIES[task]), None)])[0]
    if task == "sparse-embedding":
        # a term whose weight is about 0 may be listed by one build and not the other
        got, want = ([{t["index"]: t["value"] for t in terms} for terms in a] for a in (got, want))
        for g, w in zip(got, want, strict=True):
            assert all(abs(g.get(i, 0.0) - w.get(i, 0.0)) < 1e-4 for i in set(g) | set(w))
        return
    assert same_answers(got, want), task


def test_neuronx_token_embeddings_equal_the_cpu_build(tmp_path, minilm_dir):
    """Every token's vector after the pooled one, unpadded per text as on the CPU."""
    model = tiny_model(tmp_path / "model", minilm_dir, "feature-extraction", seed=7)
    fields = {"pooling": "mean", "token_embeddings": True}
    body = json.dumps({"inputs": BODIES["sparse-embedding"]["inputs"],
                       "parameters": {"token_embeddings": True}})  # fmt: skip
    cpu = Runner(compile_artifact(tmp_path / "cpu", model, "feature-extraction", **fields))
    with standin_process(4):
        artifact = compile_artifact(
            tmp_path / "neuronx", model, "feature-extraction", target="neuronx", **fields
        )
        got = Runner(artifact).responses_for_bodies([(body, None)])[0]
    want = cpu.responses_for_bodies([(body, None)])[0]
    assert [len(rows) for rows in got] == [len(rows) for rows in want]
    assert same_answers(got, want)


def test_inf1_compiles_a_token_task_and_leaves_its_check_to_the_host(tmp_path, minilm_dir):
    model = tiny_model(tmp_path / "model", minilm_dir, "token-classification", seed=7)
    with standin_process(0):
        artifact = compile_artifact(
            tmp_path / "inf1", model, "token-classification", target="neuron", precision="auto"
        )
    manifest = read_manifest(artifact)
    assert manifest.validation_status == "pending" and manifest.precision == "bf16"
    assert manifest.accuracy_floor == {"min_argmax_agreement": 0.99}


def test_neuronx_compiles_a_module_per_batch_at_the_image_size(tmp_path):
    import base64

    from helpers import tiny_vit

    from neuronserve.images import sample_images

    model = tiny_vit(tmp_path / "model", "image-classification", seed=7)
    cpu = Runner(compile_artifact(tmp_path / "cpu", model, "image-classification"))
    body = json.dumps({"inputs": [base64.b64encode(b).decode() for b in sample_images(5)]})
    with standin_process(4):
        artifact = compile_artifact(
            tmp_path / "neuronx", model, "image-classification", target="neuronx"
        )
        assert sorted(read_manifest(artifact).modules) == ["b1_s32", "b4_s32"]
        got = Runner(artifact).responses_for_bodies([(body, None)])[0]
    assert same_answers(got, cpu.responses_for_bodies([(body, None)])[0])


@pytest.mark.parametrize("task", ["question-answering", "image-classification", "sparse-embedding"])
def test_inf1_builds_are_checked_on_a_host_and_serve(tmp_path, minilm_dir, task):
    """Inf1 runs bf16 (its fast math): each build is judged by the task's own measure on
    a host with NeuronCores, and serves the task's answers."""
    import base64

    from helpers import tiny_vit

    from neuronserve.images import sample_images

    if task == "image-classification":
        model = tiny_vit(tmp_path / "model", task, seed=7)
        body = {"inputs": [base64.b64encode(b).decode() for b in sample_images(3)]}
        metric = "top1_agreement"
    elif task == "sparse-embedding":
        model = tiny_model(tmp_path / "model", minilm_dir, task, seed=7)
        body, metric = BODIES[task], "min_cosine"
    else:
        model = tiny_model(tmp_path / "model", minilm_dir, task, seed=7)
        body = {"question": "Who met Bob?", "context": BODIES[task]["context"]}
        metric = "span_agreement"
    with standin_process(4):
        artifact = compile_artifact(
            tmp_path / "inf1", model, task, target="neuron", precision="auto"
        )
        manifest = read_manifest(artifact)
        assert manifest.validation_status == "passed" and manifest.precision == "bf16"
        assert 0.0 <= manifest.accuracy[metric] <= 1.0
        answer = Runner(artifact).responses_for_bodies([(json.dumps(body), None)])[0]
    if task == "image-classification":
        assert [len(a) for a in answer] == [5, 5, 5] and {"label", "score"} <= set(answer[0][0])
    elif task == "sparse-embedding":
        assert len(answer) == 3 and all(t["value"] > 0 for terms in answer for t in terms)
    else:
        assert set(answer) == {"score", "start", "end", "answer"}
        assert BODIES[task]["context"][answer["start"] : answer["end"]] == answer["answer"]
