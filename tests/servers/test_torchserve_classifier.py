"""A tiny random-weight classifier through a real TorchServe, in the no-archive format
with token auth off: labels and scores equal the Runner's in process; a bad parameter
is a 400; `--truncation` at packaging time overrides the artifact's truncation off."""

from __future__ import annotations

import pytest
import requests
from helpers import run_cli, write_spec

pytestmark = pytest.mark.server
MODEL = "tiny-classifier"


@pytest.fixture(scope="module")
def server(tmp_path_factory, classifier_artifact):
    work = tmp_path_factory.mktemp("classifier")
    spec = write_spec(
        work,
        name=MODEL,
        artifact=classifier_artifact,
        model_store="store",
        run_dir="run",
        workers=1,
        cores_per_worker=1,
        archive_format="no-archive",
        token_auth=False,
    )
    # the artifact was compiled with truncation off; --truncation here turns it on again
    run_cli("package", "torchserve", "--spec", "deploy.yaml", "--truncation", cwd=work)
    assert (work / "store" / MODEL / "MAR-INF" / "MANIFEST.json").is_file()  # a folder, no .mar
    run_cli("serve", "torchserve", "--spec", "deploy.yaml", cwd=work)
    yield f"http://127.0.0.1:{spec['inference_port']}/predictions/{MODEL}"
    run_cli("serve", "torchserve", "--spec", "deploy.yaml", "--stop", cwd=work)


def test_labels_and_scores_equal_the_runners(server, classifier_runner):
    texts = ["what a wonderful day", "this is awful", "ok", " ".join(["long"] * 40)]
    pairs = [{"text": "is the product good?", "text_pair": "it broke after a day"}]
    for body in (
        {"inputs": texts, "parameters": {"top_k": None}},
        {"inputs": pairs, "parameters": {"top_k": 3}},
        {"inputs": texts[0]},
    ):
        r = requests.post(server, json=body, timeout=60)
        assert r.status_code == 200, r.text  # no token needed
        assert r.json() == classifier_runner.responses_for_bodies([(body, None)])[0]
    one = requests.post(server, json={"inputs": texts[0]}, timeout=60).json()
    assert len(one) == 1  # top_k defaults to 1


def test_bad_top_k_is_a_400(server):
    r = requests.post(server, json={"inputs": "x", "parameters": {"top_k": "all"}}, timeout=60)
    assert r.status_code == 400 and "top_k" in r.json()["error"]


def test_truncation_given_at_packaging_wins_over_the_artifact(server, classifier_artifact):
    from neuronserve.runtime import Runner

    long_text = " ".join(["long"] * 100)  # 102 tokens, the artifact holds 64
    body = {"inputs": [long_text, "short"]}
    r = requests.post(server, json=body, timeout=60)
    assert r.status_code == 200, r.text
    truncating = Runner(classifier_artifact, truncation=True, warmup=False)
    assert r.json() == truncating.responses_for_bodies([(body, None)])[0]
