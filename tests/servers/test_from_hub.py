"""From a model id to an endpoint in one command: `neuronserve serve front --model <Hub id>
--model <folder>` offline against a pre-filled Hugging Face cache downloads nothing,
compiles both for this host (the task from each config), serves them on its own workers
with answers equal to eager transformers, and the second start compiles nothing. A
second front on the same port fails, naming the port and the deployment holding it."""

from __future__ import annotations

import os

import numpy as np
import pytest
import requests
from helpers import (
    HUB_TEST_ID,
    SENTENCES,
    eager_classifier_scores,
    free_port,
    hub_cache,
    label_scores,
    reference_embeddings,
    run_cli,
    standin_env,
    standin_events,
    standin_process,
    write_spec,
)
from optimum_exports import optimum_export

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


EXPORT_ID = "neuronserve-tests/tiny-embedder-neuronx"


def test_an_optimum_neuron_export_served_as_it_is(tmp_path, tiny_embedder_dir, monkeypatch):
    """A sentence-transformers model optimum-neuron exported (a Hub id, offline): served
    on the host's NeuronCores without a compile, each call the export's one shape, its
    answers the eager model's mean pooling, normalised unless the request says not."""
    log, port = tmp_path / "standin.jsonl", free_port()
    with standin_process(4, log=log):
        export = optimum_export(
            tmp_path / "export", tiny_embedder_dir, kind="sentence-transformers", batch=4
        )
    cache = hub_cache(tmp_path / "hf" / "hub", EXPORT_ID, export)
    env = {
        **{k: v for k, v in os.environ.items() if k != "NEURONSERVE_ADMIN_KEY"},
        **standin_env(4, log=log, devices=tmp_path / "devices"),
        "NEURONSERVE_LEASE_DIR": str(tmp_path / "leases"),
        # the cores a container is given: how the host says it serves neuronx (host_target)
        "NEURON_RT_VISIBLE_CORES": "0-3",
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(cache),
        "NEURONSERVE_CACHE": str(tmp_path / "ns-cache"),
    }
    write_spec(tmp_path, front_port=port, front_run_dir="front", workers=2)
    refused = run_cli(
        "serve", "front", "--model", EXPORT_ID, "--spec", "deploy.yaml", cwd=tmp_path, env=env,
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "runs code of its own" in refused.stderr, refused
    out = run_cli(
        "serve", "front", "--model", EXPORT_ID, "--allow-exported-module", "--spec",
        "deploy.yaml", cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        assert "an optimum-neuron export compiled by neuronx-cc" in out.stdout, out.stdout
        assert "served as it is" in out.stdout
        url, texts = f"http://127.0.0.1:{port}", SENTENCES[:6]
        raw = reference_embeddings(tiny_embedder_dir, texts, normalize=False)
        got = requests.post(f"{url}/embed", json={"inputs": texts}, timeout=60)
        assert got.status_code == 200, got.text
        want = raw / np.linalg.norm(raw, axis=1, keepdims=True)
        np.testing.assert_allclose(np.array(got.json()), want, atol=1e-4)
        got = requests.post(f"{url}/embed", json={"inputs": texts, "normalize": False}, timeout=60)
        np.testing.assert_allclose(np.array(got.json()), raw, atol=1e-4)
        openai = requests.post(
            f"{url}/v1/embeddings", json={"input": texts[0], "model": "tiny-embedder-neuronx"},
            timeout=60,
        )  # fmt: skip
        assert openai.status_code == 200, openai.text
        np.testing.assert_allclose(openai.json()["data"][0]["embedding"], want[0], atol=1e-4)
    finally:
        run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=tmp_path, env=env)
    # nothing traced after the export was made; every call the export's one shape
    events = standin_events(log)
    made = max(i for i, e in enumerate(events) if e["event"] == "trace")
    assert not [e for e in events[made + 1 :] if e["event"] == "trace"]
    shapes = {tuple(e["shapes"][0]) for e in events[made + 1 :] if e["event"] == "execute"}
    assert shapes == {(4, 32)}
