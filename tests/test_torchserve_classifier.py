"""A tiny random-weight classifier through a real TorchServe: labels and scores equal
the eager model's; a plan with more workers than core groups fails at start with the
documented error instead of hanging; the no-archive format and token auth off."""

from __future__ import annotations

import numpy as np
import psutil
import pytest
import requests
import yaml
from conftest import eager_classifier_scores, free_port, run_cli

pytestmark = pytest.mark.server
MODEL = "tiny-classifier"
LABELS = ["negative", "neutral", "positive"]


def _spec(work, artifact, **extra):
    spec = {"name": MODEL, "artifact": str(artifact), "model_store": "store", "run_dir": "run",
            "cores_per_worker": 1, "inference_port": free_port(),
            "management_port": free_port(), "metrics_port": free_port(),
            "grpc_inference_port": free_port(), "grpc_management_port": free_port(), **extra}
    (work / "deploy.yaml").write_text(yaml.safe_dump(spec))
    return spec


def test_more_workers_than_groups_fails_at_start(tmp_path, classifier_artifact):
    groups = len(psutil.Process().cpu_affinity())
    _spec(tmp_path, classifier_artifact, workers=groups + 1)
    pkg = run_cli("package", "torchserve", "--spec", "deploy.yaml", cwd=tmp_path)
    assert f"workers beyond {groups} will fail to start" in pkg.stdout
    proc = run_cli("serve", "torchserve", "--spec", "deploy.yaml", "--timeout", "300",
                   cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "a worker failed to start" in proc.stderr
    assert f"Run at most {groups} worker(s)" in proc.stderr
    # the failed start cleaned up after itself
    assert not (tmp_path / "run/tmp/.model_server.pid").exists()


@pytest.fixture(scope="module")
def server(tmp_path_factory, classifier_artifact):
    work = tmp_path_factory.mktemp("classifier")
    spec = _spec(work, classifier_artifact, workers=1, archive_format="no-archive",
                 token_auth=False)
    run_cli("package", "torchserve", "--spec", "deploy.yaml", cwd=work)
    assert (work / "store" / MODEL / "MAR-INF" / "MANIFEST.json").is_file()  # a folder, no .mar
    run_cli("serve", "torchserve", "--spec", "deploy.yaml", cwd=work)
    yield f"http://127.0.0.1:{spec['inference_port']}/predictions/{MODEL}"
    run_cli("serve", "torchserve", "--spec", "deploy.yaml", "--stop", cwd=work)


def test_labels_and_scores_equal_eager(server, classifier_dir):
    texts = ["what a wonderful day", "this is awful", "ok", " ".join(["long"] * 40)]
    pairs = [("is the product good?", "it broke after a day")]
    want = eager_classifier_scores(classifier_dir, texts + pairs)
    r = requests.post(server, json={"inputs": texts, "parameters": {"top_k": None}}, timeout=60)
    p = requests.post(server, json={"inputs": [{"text": a, "text_pair": b} for a, b in pairs],
                                    "parameters": {"top_k": 3}}, timeout=60)
    assert r.status_code == 200 and p.status_code == 200, (r.text, p.text)  # no token needed
    for got, ref in zip(r.json() + p.json(), want, strict=True):
        scores = {x["label"]: x["score"] for x in got}
        assert np.allclose([scores[lab] for lab in LABELS], ref, atol=1e-5)
        assert got[0]["label"] == LABELS[int(np.argmax(ref))]
    one = requests.post(server, json={"inputs": texts[0]}, timeout=60).json()
    assert len(one) == 1 and one[0]["label"] == LABELS[int(np.argmax(want[0]))]


def test_bad_top_k_is_a_400(server):
    r = requests.post(server, json={"inputs": "x", "parameters": {"top_k": "all"}}, timeout=60)
    assert r.status_code == 400 and "top_k" in r.json()["error"]
