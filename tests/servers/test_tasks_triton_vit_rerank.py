"""An image classifier and a reranker behind a real tritonserver, asked with tritonclient:
IMAGE rows of encoded JPEG/PNG/WebP bytes in, LOGITS/SCORES/LABEL out, the labels the
image-classification pipeline gives; a query in every TEXT row and a document per
TEXT_PAIR row in, SCORE out, the eager cross-encoder's scores. An undecodable image is a
400 for its request only."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from helpers import compile_artifact, serving_models, settled, tiny_model, tiny_vit, triton_rows
from tritonclient.utils import InferenceServerException

from neuronserve.images import sample_images
from neuronserve.tasks.text_classification import softmax

pytestmark = pytest.mark.server

IMAGES = sample_images(7, seed=9)
QUERY = "where is the lake?"
DOCS = ["Zürich has a lake.", "naïve café 🎉", "x", "Paris is in France.", "東京", "lake lake"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("triton-vit-rerank")
    vit = tiny_vit(root / "vit", "image-classification", seed=21)
    ranker = tiny_model(root / "ranker", minilm_dir, "rerank", seed=22, initializer_range=0.5)
    return {
        "labels": (vit, compile_artifact(root / "vit-artifact", vit, "image-classification")),
        "ranker": (ranker, compile_artifact(root / "ranker-artifact", ranker, "rerank")),
    }


@pytest.fixture(scope="module")
def client(tmp_path_factory, models):
    work = tmp_path_factory.mktemp("triton-vit-rerank-serve")
    with serving_models(work, "triton", {k: v[1] for k, v in models.items()}) as spec:
        assert 'name: "IMAGE"' in (work / "repo" / "labels" / "config.pbtxt").read_text()
        client = httpclient.InferenceServerClient(f"127.0.0.1:{spec['http_port']}", concurrency=3)
        yield client
        client.close()


def test_image_labels_equal_the_pipelines(client, models):
    from PIL import Image
    from transformers import pipeline

    pipe = pipeline("image-classification", model=str(models["labels"][0]), top_k=None)
    result = client.infer("labels", [triton_rows("IMAGE", IMAGES[:4])])  # at most max_batch
    scores = softmax(result.as_numpy("LOGITS"))
    for got, image in zip(scores, IMAGES[:4], strict=True):
        want = {w["label"]: w["score"] for w in pipe(Image.open(io.BytesIO(image)))}
        assert np.allclose([want[x] for x in ("cat", "dog", "car", "tree", "lake")], got, atol=1e-4)
    labels = [x[0].decode() for x in result.as_numpy("LABEL")]
    assert labels == [["cat", "dog", "car", "tree", "lake"][i] for i in scores.argmax(-1)]


def test_rerank_scores_equal_the_eager_cross_encoders(client, models):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model_dir = models["ranker"][0]
    tok = AutoTokenizer.from_pretrained(model_dir)
    eager = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        enc = tok([QUERY] * 4, DOCS[:4], return_tensors="pt", padding=True)
        want = torch.sigmoid(eager(**enc).logits[:, 0]).numpy()
    got = client.infer(
        "ranker", [triton_rows("TEXT", [QUERY] * 4), triton_rows("TEXT_PAIR", DOCS[:4])]
    )
    assert np.allclose(got.as_numpy("SCORE")[:, 0], want, atol=1e-4)


def test_a_bad_image_fails_alone(client):
    pending = [
        client.async_infer("labels", [triton_rows("IMAGE", IMAGES[:2])]),
        client.async_infer("labels", [triton_rows("IMAGE", [IMAGES[2], b"not an image"])]),
        client.async_infer("labels", [triton_rows("IMAGE", IMAGES[3:5])]),
    ]
    results = settled(pending)
    assert isinstance(results[1], InferenceServerException) and results[1].status() == "400"
    assert "image 1 is not an image" in results[1].message()
    assert results[0].as_numpy("LOGITS").shape == results[2].as_numpy("LOGITS").shape == (2, 5)
