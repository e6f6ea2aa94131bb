"""A fill-mask model and an image feature extractor behind a real tritonserver, asked with
tritonclient the way a Triton user asks: TEXT rows and a `top_k` request parameter in,
the JSON per text in PREDICTIONS equal to the fill-mask pipeline's; IMAGE rows of JPEG,
PNG and WebP bytes of several sizes and modes in, EMBEDDING equal to the
image-feature-extraction pipeline's pooled hidden states. A text without a mask token
fails alone."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from helpers import (
    compile_artifact,
    same_answers,
    serving_models,
    settled,
    tiny_model,
    tiny_vit,
    triton_rows,
)
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.server

TEXTS = ["Ana met [MASK] in Paris.", "naïve [MASK] 🎉", "[MASK]", "東京 and [MASK] [MASK]"]


def _image(size: tuple[int, int], mode: str, fmt: str) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(sum(size))
    rgb = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    out = io.BytesIO()
    rgb.convert(mode).save(out, format=fmt)
    return out.getvalue()


IMAGES = [
    _image((40, 24), "RGB", "JPEG"),
    _image((17, 50), "RGBA", "PNG"),
    _image((64, 64), "L", "WEBP"),
    _image((31, 33), "P", "PNG"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("triton-fill-features")
    fill = tiny_model(root / "fill", minilm_dir, "fill-mask", seed=41, initializer_range=0.5)
    vit = tiny_vit(root / "vit", "image-feature-extraction", seed=42)
    return {
        "fill": (fill, compile_artifact(root / "fill-artifact", fill, "fill-mask")),
        "features": (
            vit,
            compile_artifact(
                root / "vit-artifact", vit, "image-feature-extraction", pooling="mean"
            ),
        ),
    }


@pytest.fixture(scope="module")
def client(tmp_path_factory, models):
    work = tmp_path_factory.mktemp("triton-fill-features-serve")
    with serving_models(work, "triton", {k: v[1] for k, v in models.items()}) as spec:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{spec['http_port']}", concurrency=3)
        yield client
        client.close()  # tritonserver waits for open connections before it stops


def test_predictions_equal_the_fill_mask_pipelines(client, models):
    from transformers import pipeline

    pipe = pipeline("fill-mask", model=str(models["fill"][0]))
    for params in ({}, {"top_k": 3}):
        result = client.infer("fill", [triton_rows("TEXT", TEXTS)], parameters=params or None)
        got = [json.loads(v[0]) for v in result.as_numpy("PREDICTIONS")]
        assert same_answers(got, pipe(TEXTS, **params))


def test_embeddings_equal_the_feature_extraction_pipelines(client, models):
    from PIL import Image
    from transformers import pipeline

    pipe = pipeline("image-feature-extraction", model=str(models["features"][0]))
    want = [np.asarray(pipe(Image.open(io.BytesIO(b)))[0]).mean(axis=0) for b in IMAGES]
    got = client.infer("features", [triton_rows("IMAGE", IMAGES)]).as_numpy("EMBEDDING")
    assert got.shape == (len(IMAGES), len(want[0]))
    assert np.allclose(got, np.array(want), atol=1e-4)


def test_a_text_without_a_mask_fails_alone(client):
    pending = [
        client.async_infer("fill", [triton_rows("TEXT", TEXTS[:2])]),
        client.async_infer("fill", [triton_rows("TEXT", [TEXTS[0], "no mask here"])]),
        client.async_infer("fill", [triton_rows("TEXT", TEXTS[:1])], parameters={"top_k": "two"}),
        client.async_infer("fill", [triton_rows("TEXT", TEXTS[:2])]),
    ]
    results = settled(pending)
    for bad, needle in ((results[1], "no mask token"), (results[2], "top_k")):
        assert isinstance(bad, InferenceServerException) and bad.status() == "400"
        assert needle in bad.message(), bad.message()
    first, last = (
        [json.loads(v[0]) for v in r.as_numpy("PREDICTIONS")] for r in (results[0], results[3])
    )
    assert first == last and len(first) == 2
