"""Image classification and image feature extraction (ViT) through the Runner, against the
transformers pipelines on the eager model: images of several sizes, modes (RGB, RGBA, L,
CMYK, P) and formats, sent as raw bytes, base64 JSON, data URLs and multipart forms."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from helpers import compile_artifact, same_answers, through_the_wire, tiny_vit
from urllib3 import encode_multipart_formdata

from neuronserve import tensors
from neuronserve.execution import RunReport
from neuronserve.images import sample_images
from neuronserve.runtime import Runner
from neuronserve.tasks import RequestError

IMAGES = sample_images(10, seed=3)


def _pil(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    root = tmp_path_factory.mktemp("vit-classifier")
    model = tiny_vit(root / "model", "image-classification", seed=1)
    return model, Runner(compile_artifact(root / "artifact", model, "image-classification"))


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    root = tmp_path_factory.mktemp("vit-features")
    model = tiny_vit(root / "model", "image-feature-extraction", seed=2)
    runners = {}
    for pooling in ("cls", "mean"):
        artifact = compile_artifact(
            root / pooling, model, "image-feature-extraction", pooling=pooling
        )
        runners[pooling] = Runner(artifact)
    return model, runners


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_labels_equal_the_pipeline_for_every_way_of_sending(classifier):
    from transformers import pipeline

    model, runner = classifier
    pipe = pipeline("image-classification", model=str(model))
    want = [pipe(_pil(b)) for b in IMAGES]
    assert len(want[0]) == 5  # the pipeline's top 5
    multipart, boundary_type = encode_multipart_formdata(
        [
            ("a", ("a.png", IMAGES[0], "image/png")),
            ("b", ("b.jpg", IMAGES[3], "image/jpeg")),
            ("parameters", json.dumps({"top_k": 2})),
        ]
    )
    bodies = [
        (IMAGES[1], "image/png"),  # raw bytes, one image: one answer
        (json.dumps({"inputs": [_b64(b) for b in IMAGES]}), "application/json"),
        (
            json.dumps(
                {"inputs": "data:image/webp;base64," + _b64(IMAGES[2]), "parameters": {"top_k": 1}}
            ),
            None,
        ),
        (multipart, boundary_type),
        ({"data": IMAGES[4]}, None),  # how TorchServe hands over a one-field form
        ({"x": IMAGES[5], "y": IMAGES[6], "parameters": b'{"top_k": 3}'}, None),
    ]
    got = runner.responses_for_bodies(bodies)
    assert same_answers(got[0], want[1])
    assert same_answers(got[1], want)
    assert same_answers(got[2], want[2][:1])
    assert same_answers(got[3], [want[0][:2], want[3][:2]])
    assert same_answers(got[4], want[4])
    assert same_answers(got[5], [want[5][:3], want[6][:3]])


def test_more_images_than_the_largest_bucket_are_split(classifier):
    _, runner = classifier
    request = runner.parse(json.dumps({"inputs": [_b64(b) for b in IMAGES[:9]]}))
    report = RunReport()
    runner.outputs([request], report)
    assert sum(r.rows for r in report.runs) == 9 and len(report.runs) >= 3
    assert {r.bucket.seq for r in report.runs} == {32}  # the grid's one size: the image's


def test_bad_images_fail_alone(classifier):
    _, runner = classifier
    good = (IMAGES[0], "image/png")
    bodies = [
        good,
        (b"\x89PNG but not really", "image/png"),
        (json.dumps({"inputs": [_b64(IMAGES[1]), _b64(b"GIF89a broken")]}), "application/json"),
        (json.dumps({"inputs": "%%% not base64"}), "application/json"),
        (json.dumps({"inputs": 7}), "application/json"),
        (json.dumps({"inputs": []}), "application/json"),
        (b"", "image/jpeg"),
        encode_multipart_formdata([("parameters", "{}")]),
        good,
    ]
    out = runner.responses_for_bodies(bodies)
    for i, needle in enumerate(
        [
            "not an image",
            "image 1 is not an image",
            "base64",
            "base64",
            "at least one",
            "empty",
            "without an image",
        ],
        start=1,
    ):
        assert isinstance(out[i], RequestError) and out[i].status == 400, (i, out[i])
        assert needle in out[i].message, (i, out[i].message)
    assert out[0] == out[8] and not isinstance(out[0], RequestError)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_image_features_equal_the_pipelines_hidden_states(features, pooling):
    from transformers import pipeline

    model, runners = features
    pipe = pipeline("image-feature-extraction", model=str(model))
    hidden = [np.asarray(pipe(_pil(b))[0]) for b in IMAGES[:5]]  # (tokens, hidden)
    want = [h[0] if pooling == "cls" else h.mean(axis=0) for h in hidden]
    got = runners[pooling].responses_for_bodies(
        [(json.dumps({"inputs": [_b64(b) for b in IMAGES[:5]]}), "application/json")]
    )[0]
    assert np.allclose(np.array(got), np.array(want), atol=1e-4)


def test_triton_tensors_carry_the_same_labels(classifier):
    _, runner = classifier
    task = runner.task
    request = runner.parse(
        json.dumps({"inputs": [_b64(b) for b in IMAGES[:3]], "parameters": {"top_k": 2}})
    )
    results = runner.outputs([request])[0]
    codec = tensors.of(task.name)
    sent = codec.encode(results, runner.info)
    assert list(sent) == ["LOGITS", "SCORES", "LABEL"]
    rebuilt = task.respond(through_the_wire(results), request, runner.manifest.task_info())
    assert same_answers(rebuilt, runner.responses([request])[0], atol=1e-6)


def test_the_manifest_records_the_image_size_and_the_task_measure(classifier):
    _, runner = classifier
    m = runner.manifest
    assert m.image is not None and m.image.shape == (3, 32, 32) and m.tokenizer is None
    assert m.sequence_lengths == [32] and m.accuracy_floor == {"min_top1_agreement": 0.99}
    assert m.accuracy["top1_agreement"] == 1.0
