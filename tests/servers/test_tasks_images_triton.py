"""Image classification and image feature extraction behind a real tritonserver: IMAGE
rows of encoded JPEG/PNG/WebP bytes in, LOGITS/SCORES/LABEL and EMBEDDING out, equal to
the Runner's in process; an undecodable image is a 400 for its request only."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from helpers import compile_artifact, run_cli, tiny_vit, write_spec
from tritonclient.utils import InferenceServerException

from neuronserve.images import sample_images
from neuronserve.runtime import Runner

pytestmark = pytest.mark.server

IMAGES = sample_images(7, seed=9)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton-images")
    out = {}
    for name, task in (
        ("labels", "image-classification"),
        ("features", "image-feature-extraction"),
    ):
        model = tiny_vit(root / name, task, seed=21)
        out[name] = compile_artifact(root / f"{name}-artifact", model, task)
    return out


@pytest.fixture(scope="module")
def client(tmp_path_factory, artifacts):
    work = tmp_path_factory.mktemp("triton-images-serve")
    common = {"triton_repository": "repo", "triton_run_dir": "run", "workers": 1}
    spec = write_spec(work, name="labels", artifact=artifacts["labels"], **common)
    run_cli("package", "triton", "--spec", "deploy.yaml", cwd=work)
    run_cli(
        "package", "triton", artifacts["features"], "--repository", "repo", "--name", "features",
        "--instances", "1", cwd=work,
    )  # fmt: skip
    assert 'name: "IMAGE"' in (work / "repo" / "labels" / "config.pbtxt").read_text()
    run_cli("serve", "triton", "--spec", "deploy.yaml", cwd=work)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{spec['http_port']}", concurrency=3)
    yield client
    client.close()
    run_cli("serve", "triton", "--spec", "deploy.yaml", "--stop", cwd=work)


def _images(payloads):
    t = httpclient.InferInput("IMAGE", [len(payloads), 1], "BYTES")
    t.set_data_from_numpy(np.array([[p] for p in payloads], dtype=object))
    return [t]


def test_outputs_equal_the_runners(client, artifacts):
    for name, output in (("labels", "LOGITS"), ("features", "EMBEDDING")):
        runner = Runner(artifacts[name])
        [want] = runner.outputs([runner.task.parse(IMAGES[:4], {})])
        got = client.infer(name, _images(IMAGES[:4])).as_numpy(output)  # at most max_batch
        assert np.allclose(got, want, atol=1e-5), name
    labels = client.infer("labels", _images(IMAGES[:2])).as_numpy("LABEL")
    assert all(x[0].decode() in {"cat", "dog", "car", "tree", "lake"} for x in labels)


def test_a_bad_image_fails_alone(client):
    pending = [
        client.async_infer("labels", _images(IMAGES[:2])),
        client.async_infer("labels", _images([IMAGES[2], b"not an image"])),
        client.async_infer("labels", _images(IMAGES[3:5])),
    ]
    results = []
    for p in pending:
        try:
            results.append(p.get_result())
        except InferenceServerException as e:
            results.append(e)
    assert isinstance(results[1], InferenceServerException) and results[1].status() == "400"
    assert "image 1 is not an image" in results[1].message()
    assert results[0].as_numpy("LOGITS").shape == results[2].as_numpy("LOGITS").shape == (2, 5)
