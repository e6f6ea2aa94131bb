"""The tiny classifier behind a real tritonserver, next to a copy of it whose module
fails on one word: answers equal the Runner's in process (TEXT and TEXT_PAIR), and each
kind of failure keeps its status as far as Triton's protocol can carry it (400 for a bad
request, 500 when the model fails, the Runner's 413 in the message of a 400: packaged
without --truncation, the artifact's truncation off is what the instances use)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from helpers import LABELS, run_cli, write_spec
from tritonclient.utils import InferenceServerException

from neuronserve.artifact import read_manifest, write_manifest
from neuronserve.tasks import get_task
from neuronserve.tasks.text_classification import softmax
from neuronserve.tokenization import TextTokenizer

pytestmark = pytest.mark.server
TRIGGER = "detonate"  # the failing copy's module raises on this word's first token


class FailsOnToken(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, token: int):
        super().__init__()
        self.inner, self.token = inner, token

    def forward(self, input_ids, attention_mask, token_type_ids):
        if bool((input_ids == self.token).any()):
            raise RuntimeError("injected model failure")
        return self.inner(input_ids, attention_mask, token_type_ids)


def torchscript_of(artifact, manifest, model_dir):
    """The artifact's module as TorchScript: itself when it is one, else the eager model
    traced (an fp32 build may be an ONNX Runtime graph, which cannot be wrapped)."""
    path = artifact / manifest.modules["dynamic"]
    if path.suffix == ".pt":
        return torch.jit.load(str(path))
    task = get_task(manifest.task)
    names = [i.name for i in manifest.inputs]
    options = {"pooling": None, "normalize": None, "input_names": names}
    module = task.wrap(task.load_model(model_dir), model_dir, options).module.eval()
    example = tuple(torch.ones(1, 8, dtype=torch.long) for _ in names)
    with torch.no_grad():
        return torch.jit.trace(module, example, check_trace=False)


def failing_copy(artifact, out, model_dir):
    """The classifier artifact with its module wrapped to fail on TRIGGER, re-hashed."""
    shutil.copytree(artifact, out)
    manifest = read_manifest(out)
    token = TextTokenizer(out / "tokenizer.json", 64).encode([TRIGGER], False)[0].ids[1]
    wrapped = torch.jit.script(FailsOnToken(torchscript_of(out, manifest, model_dir), token))
    (out / manifest.modules["dynamic"]).unlink()
    torch.jit.save(wrapped, str(out / "model.pt"))
    update = {"name": "failing", "modules": {"dynamic": "model.pt"}}
    write_manifest(out, manifest.model_copy(update=update))
    return out


@pytest.fixture(scope="module")
def client(tmp_path_factory, classifier_artifact, classifier_dir):
    work = tmp_path_factory.mktemp("triton-classifier")
    common = {
        "triton_repository": "repo",
        "triton_run_dir": "run",
        "workers": 1,
        "cores_per_worker": 1,
    }
    spec = write_spec(work, name="classifier", artifact=classifier_artifact, **common)
    run_cli("package", "triton", "--spec", "deploy.yaml", cwd=work)
    failing = failing_copy(classifier_artifact, work / "failing-artifact", classifier_dir)
    run_cli(
        "package",
        "triton",
        failing,
        "--repository",
        "repo",
        "--name",
        "failing",
        "--instances",
        "1",
        cwd=work,
    )
    run_cli("serve", "triton", "--spec", "deploy.yaml", cwd=work)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{spec['http_port']}")
    yield client
    client.close()  # tritonserver waits for open connections before it stops
    run_cli("serve", "triton", "--spec", "deploy.yaml", "--stop", cwd=work)


def infer(client, model, texts, pairs=None):
    inputs = []
    for name, values in (("TEXT", texts), ("TEXT_PAIR", pairs)):
        if values is not None:
            t = httpclient.InferInput(name, [len(values), 1], "BYTES")
            raw = [v if isinstance(v, bytes) else v.encode() for v in values]
            t.set_data_from_numpy(np.array([[v] for v in raw], dtype=object))
            inputs.append(t)
    return client.infer(model, inputs)


def test_scores_labels_and_pairs_equal_the_runners(client, classifier_runner):
    texts = ["I loved every minute", "worst purchase ever", "it is fine", "Ünïcödé 🚀 text"]
    firsts, seconds = ["is it good?", "short"], ["no, it broke", "a longer second text here"]
    [rows] = classifier_runner.outputs([classifier_runner.parse({"inputs": texts})])
    result = infer(client, "classifier", texts)
    assert np.array_equal(result.as_numpy("LOGITS"), rows)
    assert np.allclose(result.as_numpy("SCORES"), softmax(rows), atol=1e-7)
    assert [x[0].decode() for x in result.as_numpy("LABEL")] == [LABELS[i] for i in rows.argmax(-1)]
    pairs = [{"text": a, "text_pair": b} for a, b in zip(firsts, seconds, strict=True)]
    [pair_rows] = classifier_runner.outputs([classifier_runner.parse({"inputs": pairs})])
    assert np.array_equal(
        infer(client, "classifier", firsts, seconds).as_numpy("LOGITS"), pair_rows
    )


@pytest.mark.parametrize(
    "model,texts,pairs,status,needle",
    [
        ("classifier", ["a"], [b"\xff\xfe"], "400", "TEXT_PAIR[0] is not valid UTF-8"),
        ("classifier", [" ".join(["long"] * 100)], None, "400", "[413] inputs[0] is 102 tokens"),
        (
            "failing",
            [f"please {TRIGGER} it"],
            None,
            "500",
            "internal error while running the model (error id",
        ),
    ],
)
def test_each_failure_keeps_its_status(client, model, texts, pairs, status, needle):
    with pytest.raises(InferenceServerException) as e:
        infer(client, model, texts, pairs)
    assert e.value.status() == status and needle in e.value.message(), e.value.message()
    assert "injected model failure" not in e.value.message()  # internals stay in the log
    # the instance that answered is still serving
    assert infer(client, model, ["fine"]).as_numpy("LOGITS").shape == (1, 3)
