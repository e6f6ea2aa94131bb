"""From a model id to an endpoint in one command: `neuronserve serve front --model <Hub id>
--model <folder>` offline against a pre-filled Hugging Face cache downloads nothing,
compiles both for this host (the task from each config), serves them on a real engine
with answers equal to eager transformers, and the second start compiles nothing. A
second front on the same port fails, naming the port and the deployment holding it."""

from __future__ import annotations

import numpy as np
import pytest
import requests
from helpers import (
    HUB_TEST_ID,
    SENTENCES,
    eager_classifier_scores,
    free_port,
    label_scores,
    reference_embeddings,
    run_cli,
    write_spec,
)

pytestmark = pytest.mark.server

GRID = ["--batch-sizes", "1,4", "--sequence-lengths", "16,64", "--precision", "fp32"]


def test_a_hub_id_and_a_folder_served_in_one_command(
    offline_hub, tmp_path, tiny_embedder_dir, classifier_dir
):
    work = tmp_path
    port = free_port()
    write_spec(work, front_port=port, front_run_dir="front", workers=1)
    models = ["--model", HUB_TEST_ID, "--model", classifier_dir, "--pooling", "mean"]
    start = [*models, "--normalize", *GRID, "--spec", "deploy.yaml"]
    first = run_cli("serve", "front", *start, cwd=work)
    try:
        assert f"{HUB_TEST_ID}: compiling for feature-extraction on cpu" in first.stdout
        assert f"{classifier_dir}: compiling for text-classification on cpu" in first.stdout
        url = f"http://127.0.0.1:{port}"
        names = {m["model_id"]: m["task"] for m in requests.get(f"{url}/info").json()["models"]}
        assert names == {"tiny-embedder": "feature-extraction", "tiny-classifier": (
            "text-classification")}  # fmt: skip
        texts = SENTENCES[:6]
        got = requests.post(f"{url}/embed", json={"inputs": texts, "model": "tiny-embedder"})
        assert got.status_code == 200, got.text
        want = reference_embeddings(tiny_embedder_dir, texts)
        np.testing.assert_allclose(np.array(got.json()), want, atol=1e-4)
        scores = requests.post(
            f"{url}/predict", json={"inputs": texts[4], "model": "tiny-classifier"}
        )
        assert scores.status_code == 200, scores.text
        np.testing.assert_allclose(
            label_scores(scores.json()),
            eager_classifier_scores(classifier_dir, [texts[4]])[0],
            atol=1e-4,
        )
        # the same port, another run folder: refused, naming who holds it
        other = run_cli(
            "serve", "front", *start, "--run-dir", work / "other", cwd=work, check=False
        )
        assert other.returncode == 1, other.stdout
        assert f"port {port}" in other.stderr
        assert f"neuronserve front of run folder {work / 'front'}" in other.stderr
        assert "ready at" not in other.stdout
    finally:
        run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=work)
    # the Hub model alone, with the same compile options: nothing compiled again
    alone = ["--model", HUB_TEST_ID, "--pooling", "mean", "--normalize", *GRID]
    again = run_cli("serve", "front", *alone, "--spec", "deploy.yaml", cwd=work)
    try:
        assert f"{HUB_TEST_ID}: compiled before, from the cache" in again.stdout
        assert "compiling" not in again.stdout
        # huggingface_hub's client pointed at the server posts to its root (TEI's POST /)
        from huggingface_hub import InferenceClient

        got = InferenceClient(f"http://127.0.0.1:{port}").feature_extraction(SENTENCES[7])
        want = reference_embeddings(tiny_embedder_dir, [SENTENCES[7]])
        np.testing.assert_allclose(np.asarray(got).reshape(1, -1), want, atol=1e-4)
    finally:
        run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=work)
