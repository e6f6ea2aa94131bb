"""The same artifacts behind TorchServe and Triton at once: the classifier through
Triton matches its eager model, and both servers give identical outputs (same Runner).

Each server gets its own lease directory, as if on its own host: this module checks
outputs, not placement (placement has its own tests)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
import yaml
from conftest import eager_classifier_scores, free_port, run_cli

pytestmark = pytest.mark.server
LABELS = ["negative", "neutral", "positive"]
TEXTS = ["I loved every minute", "worst purchase ever", "it is fine", "Ünïcödé 🚀 text"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, minilm_artifact, classifier_artifact):
    work = tmp_path_factory.mktemp("cross")
    ports = {k: free_port() for k in ("inference_port", "management_port", "metrics_port",
                                      "http_port", "grpc_port", "triton_metrics_port",
                                      "grpc_inference_port", "grpc_management_port")}
    common = {"workers": 1, "cores_per_worker": 1, "token_auth": False, "model_store": "store",
              "triton_repository": "repo", "run_dir": "ts", "triton_run_dir": "tr", **ports}
    for name, artifact in (("minilm", minilm_artifact), ("classifier", classifier_artifact)):
        spec = work / f"{name}.yaml"
        spec.write_text(yaml.safe_dump({"name": name, "artifact": str(artifact), **common}))
        run_cli("package", "torchserve", "--spec", spec, cwd=work)
        run_cli("package", "triton", "--spec", spec, cwd=work)
    envs = {}
    for server in ("torchserve", "triton"):
        (work / f"leases-{server}").mkdir()
        envs[server] = {**os.environ, "NEURONSERVE_LEASE_DIR": str(work / f"leases-{server}")}
    run_cli("serve", "torchserve", "--spec", work / "minilm.yaml", cwd=work,
            env=envs["torchserve"])
    try:
        run_cli("serve", "triton", "--spec", work / "minilm.yaml", cwd=work, env=envs["triton"])
    except AssertionError:
        run_cli("serve", "torchserve", "--spec", work / "minilm.yaml", "--stop", cwd=work)
        raise
    yield (f"http://127.0.0.1:{ports['inference_port']}/predictions",
           httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}"))
    run_cli("serve", "triton", "--spec", work / "minilm.yaml", "--stop", cwd=work)
    run_cli("serve", "torchserve", "--spec", work / "minilm.yaml", "--stop", cwd=work)


def _triton(client, model, texts, outputs, pairs=None):
    inputs = []
    for name, values in (("TEXT", texts), ("TEXT_PAIR", pairs)):
        if values is not None:
            t = httpclient.InferInput(name, [len(values), 1], "BYTES")
            t.set_data_from_numpy(np.array([[v.encode()] for v in values], dtype=object))
            inputs.append(t)
    result = client.infer(model, inputs)
    return [result.as_numpy(o) for o in outputs]


def test_classifier_through_triton_matches_eager(servers, classifier_dir):
    _, client = servers
    firsts, seconds = ["is it good?", "short"], ["no, it broke", "a longer second text here"]
    want = eager_classifier_scores(classifier_dir, TEXTS + list(zip(firsts, seconds, strict=True)))
    scores, label = _triton(client, "classifier", TEXTS, ["SCORES", "LABEL"])
    pair_scores, = _triton(client, "classifier", firsts, ["SCORES"], pairs=seconds)
    got = np.concatenate([scores, pair_scores])
    assert np.allclose(got, want, atol=1e-5)
    assert [x[0].decode() for x in label] == [LABELS[i] for i in np.argmax(want[:4], -1)]


def test_torchserve_and_triton_give_identical_outputs(servers):
    ts_url, client = servers
    emb_ts = np.array(requests.post(f"{ts_url}/minilm", json={"inputs": TEXTS}, timeout=60)
                      .json(), dtype=np.float32)
    emb_tr, = _triton(client, "minilm", TEXTS, ["EMBEDDING"])
    assert np.array_equal(emb_ts, emb_tr)  # bit for bit: one Runner, one compiled module

    cls_ts = requests.post(f"{ts_url}/classifier",
                           json={"inputs": TEXTS, "parameters": {"top_k": None}}, timeout=60)
    scores_tr, = _triton(client, "classifier", TEXTS, ["SCORES"])
    for got, row in zip(cls_ts.json(), scores_tr, strict=True):
        by_label = {x["label"]: x["score"] for x in got}
        # TorchServe answers in float64 JSON, Triton in an FP32 tensor of the same softmax
        assert np.allclose([by_label[lab] for lab in LABELS], row, rtol=0, atol=1e-7)
