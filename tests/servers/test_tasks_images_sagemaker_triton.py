"""An image classifier through the SageMaker `serve` entrypoint with Triton behind it:
/invocations takes the image as the body, a multipart form or base64 JSON; the front
sends IMAGE rows (no more than the largest batch per call) and answers like the Runner."""

from __future__ import annotations

import base64

import pytest
import requests
from helpers import compile_artifact, same_answers, start_sagemaker, tiny_vit

from neuronserve.images import sample_images
from neuronserve.runtime import Runner

pytestmark = pytest.mark.server

IMAGES = sample_images(9, seed=8)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("sagemaker-vit")
    model = tiny_vit(root / "model", "image-classification", seed=25)
    return compile_artifact(root / "artifact", model, "image-classification")


@pytest.fixture(scope="module")
def serve(tmp_path_factory, artifact):
    serve = start_sagemaker(tmp_path_factory.mktemp("sagemaker-triton-vit"), artifact, "triton")
    yield serve
    serve.stop()


def test_invocations_answer_like_the_runner(serve, artifact):
    runner = Runner(artifact)
    url = f"{serve.url}/invocations"
    raw = requests.post(url, data=IMAGES[0], headers={"Content-Type": "image/jpeg"}, timeout=60)
    assert raw.status_code == 200, raw.text
    assert same_answers(raw.json(), runner.responses_for_bodies([(IMAGES[0], "image/jpeg")])[0])
    form = requests.post(
        url,
        files=[("a", ("a.png", IMAGES[1], "image/png")), ("b", ("b.jpg", IMAGES[3], "image/jpeg"))],
        data={"parameters": '{"top_k": 1}'},
        timeout=60,
    )
    assert form.status_code == 200, form.text
    both = {
        "inputs": [base64.b64encode(b).decode() for b in (IMAGES[1], IMAGES[3])],
        "parameters": {"top_k": 1},
    }
    assert same_answers(form.json(), runner.responses_for_bodies([(both, None)])[0])
    small = [b for b in IMAGES if len(b) < 100_000]  # the body stays under max_body_bytes
    many = {"inputs": [base64.b64encode(b).decode() for b in (small * 3)[:9]]}  # over a batch
    r = requests.post(url, json=many, timeout=60)
    assert r.status_code == 200 and same_answers(
        r.json(), runner.responses_for_bodies([(many, None)])[0]
    )
    bad = requests.post(url, data=b"GIF89a...", headers={"Content-Type": "image/gif"}, timeout=60)
    assert bad.status_code == 400 and "not an image" in bad.json()["error"]
