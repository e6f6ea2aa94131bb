"""Image models in one TorchServe model store, asked the ways curl users ask: the raw
image as the body (`--data-binary @cat.jpg`), a multipart upload (`-F data=@cat.jpg`,
several files and a parameters field), base64 JSON; answers equal the Runner's, a body
that is not an image is a 400 while the requests sent with it are answered."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from helpers import compile_artifact, same_answers, serving_models, tiny_vit

from neuronserve.images import sample_images
from neuronserve.runtime import Runner

pytestmark = pytest.mark.server

IMAGES = sample_images(5, seed=4)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchserve-images")
    out = {}
    for name, task in (
        ("labels", "image-classification"),
        ("features", "image-feature-extraction"),
    ):
        model = tiny_vit(root / name, task, seed=23)
        out[name] = compile_artifact(root / f"{name}-artifact", model, task)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory, artifacts):
    work = tmp_path_factory.mktemp("torchserve-images-serve")
    with serving_models(work, "torchserve", artifacts) as spec:
        yield f"http://127.0.0.1:{spec['inference_port']}"


def test_every_body_answers_like_the_runner(server, artifacts):
    labels = Runner(artifacts["labels"])
    one = labels.responses_for_bodies([(IMAGES[0], "image/jpeg")])[0]
    raw = requests.post(
        f"{server}/predictions/labels",
        data=IMAGES[0],
        headers={"Content-Type": "image/jpeg"},
        timeout=60,
    )
    assert raw.status_code == 200, raw.text
    assert same_answers(raw.json(), one, atol=1e-6)
    form = requests.post(
        f"{server}/predictions/labels",
        files={"data": ("x.jpg", IMAGES[0], "image/jpeg")},
        timeout=60,
    )
    assert form.status_code == 200 and same_answers(form.json(), one, atol=1e-6)
    several = requests.post(
        f"{server}/predictions/labels",
        files=[
            ("a", ("a.png", IMAGES[1], "image/png")),
            ("b", ("b.webp", IMAGES[2], "image/webp")),
        ],
        data={"parameters": '{"top_k": 2}'},
        timeout=60,
    )
    assert several.status_code == 200, several.text
    body = {
        "inputs": [base64.b64encode(b).decode() for b in IMAGES[1:3]],
        "parameters": {"top_k": 2},
    }
    assert same_answers(several.json(), labels.responses_for_bodies([(body, None)])[0], atol=1e-6)
    features = Runner(artifacts["features"])
    got = requests.post(
        f"{server}/invocations?model_name=features", json=body | {"parameters": {}}, timeout=60
    )
    assert got.status_code == 200, got.text
    assert same_answers(
        got.json(), features.responses_for_bodies([(body | {"parameters": {}}, None)])[0], atol=1e-5
    )


def test_a_body_that_is_not_an_image_fails_alone(server):
    bodies = [IMAGES[3], b"<html>not an image</html>", IMAGES[4]]
    with ThreadPoolExecutor(3) as pool:
        answers = list(
            pool.map(
                lambda b: requests.post(
                    f"{server}/predictions/labels",
                    data=b,
                    headers={"Content-Type": "image/png"},
                    timeout=60,
                ),
                bodies,
            )
        )
    assert [a.status_code for a in answers] == [200, 400, 200]
    assert "not an image" in answers[1].json()["error"]
