"""NeuronCore placement across real server worker processes, on a fake 4-core Neuron host
(NEURONSERVE_NEURON_CORES=4) with the stand-in SDK on the workers' path. The stand-in
records NEURON_RT_VISIBLE_CORES as each process saw it when it imported torch_neuronx,
so these tests show every worker pinned itself before the SDK loaded."""

from __future__ import annotations

import json
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
import yaml
from conftest import eager_classifier_scores, free_port, run_cli, wait_for

from neuronserve.serve import torchserve as ts

pytestmark = pytest.mark.server
STANDIN = Path(__file__).parent / "neuron_standin"
MODEL = "tiny-neuronx"
TEXTS = ["fine", "not fine at all", "a somewhat longer sentence about the weather"]


@pytest.fixture(scope="module")
def neuronx_artifact(tmp_path_factory, classifier_dir):
    from neuronserve.compile import compile_model
    from neuronserve.spec import load_spec

    out = tmp_path_factory.mktemp("neuronx") / MODEL
    sys.path.insert(0, str(STANDIN))
    try:
        compile_model(load_spec(None, {
            "model": classifier_dir, "artifact": out, "task": "text-classification",
            "target": "neuronx", "batch_sizes": [1, 4], "sequence_lengths": [16, 32]}),
            progress=False)
    finally:
        sys.path.remove(str(STANDIN))
        for name in ("torch_neuronx", "_record"):
            sys.modules.pop(name, None)
    return out


def imports(log: Path) -> dict[int, dict]:
    """pid -> Neuron variables when that process imported torch_neuronx."""
    out = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        e = json.loads(line)
        if e["event"] == "import" and e["module"] == "torch_neuronx":
            out[e["pid"]] = e["env"]
    return out


@contextmanager
def serving(work: Path, engine: str, artifact: Path, workers: int, cores_per_worker: int,
            **extra):
    """Package and serve `artifact` with the stand-in on a fake 4-NeuronCore host."""
    work.mkdir(parents=True, exist_ok=True)
    log = work / "standin.jsonl"
    env = {**os.environ, "NEURONSERVE_NEURON_CORES": "4",
           "NEURONSERVE_LEASE_DIR": str(work / "leases"),
           "NEURONSERVE_STANDIN_LOG": str(log),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(STANDIN),
                                                       os.environ.get("PYTHONPATH")]))}
    spec = {"name": MODEL, "artifact": str(artifact), "workers": workers,
            "cores_per_worker": cores_per_worker, "token_auth": False,
            "model_store": "store", "run_dir": "ts", "triton_repository": "repo",
            "triton_run_dir": "tr", "inference_port": free_port(),
            "management_port": free_port(), "metrics_port": free_port(),
            "http_port": free_port(), "grpc_port": free_port(),
            "triton_metrics_port": free_port(), "grpc_inference_port": free_port(),
            "grpc_management_port": free_port(), **extra}
    (work / "deploy.yaml").write_text(yaml.safe_dump(spec))
    run_cli("package", engine, "--spec", "deploy.yaml", cwd=work, env=env)
    run_cli("serve", engine, "--spec", "deploy.yaml", cwd=work, env=env)
    try:
        yield spec, log
    finally:
        run_cli("serve", engine, "--spec", "deploy.yaml", "--stop", cwd=work, env=env)


def _ts_workers(spec) -> list[dict]:
    url = f"http://127.0.0.1:{spec['management_port']}/models/{MODEL}"
    return [w for w in requests.get(url, timeout=10).json()[0]["workers"]]


def _ts_scores(spec, texts):
    url = f"http://127.0.0.1:{spec['inference_port']}/predictions/{MODEL}"
    r = requests.post(url, json={"inputs": texts, "parameters": {"top_k": None}}, timeout=60)
    assert r.status_code == 200, r.text
    return [{x["label"]: x["score"] for x in row} for row in r.json()]


def test_torchserve_four_workers_four_cores(tmp_path, neuronx_artifact, classifier_dir):
    want = eager_classifier_scores(classifier_dir, TEXTS)
    with serving(tmp_path, "torchserve", neuronx_artifact, 4, 1,
                 worker_retry_timeout_s=5) as (spec, log):
        workers = _ts_workers(spec)
        pids = [int(w["pid"]) for w in workers]
        assert len(pids) == 4 and all(w["status"] == "READY" for w in workers)
        seen = imports(log)
        assert sorted(seen[p]["NEURON_RT_VISIBLE_CORES"] for p in pids) == ["0", "1", "2", "3"]
        assert all(seen[p]["NEURON_RT_NUM_CORES"] == "1" for p in pids)
        assert all(seen[p]["NEURONCORE_GROUP_SIZES"] is None for p in pids)  # Inf1 only
        for got, ref in zip(_ts_scores(spec, TEXTS), want, strict=True):
            assert np.allclose([got[k] for k in ("negative", "neutral", "positive")], ref,
                               atol=1e-5)

        # a killed worker's replacement imports the SDK with the cores it freed
        victim = pids[0]
        freed = seen[victim]["NEURON_RT_VISIBLE_CORES"]
        os.kill(victim, signal.SIGKILL)

        def replacement():
            ready = [int(w["pid"]) for w in _ts_workers(spec) if w["status"] == "READY"]
            new = set(ready) - set(pids)
            return len(ready) == 4 and new and new.pop()

        new_pid = wait_for(replacement, timeout=120, what="a replacement worker")
        assert imports(log)[new_pid]["NEURON_RT_VISIBLE_CORES"] == freed

        # a fifth worker on the 4-group plan fails with the documented error, and says so
        mgmt = f"http://127.0.0.1:{spec['management_port']}/models/{MODEL}"
        requests.put(f"{mgmt}?min_worker=5&max_worker=5", timeout=30)
        failures = wait_for(lambda: ts.worker_failures(tmp_path / "ts" / "logs"), timeout=120,
                            what="the fifth worker's failure")
        assert "no free neuron core group" in failures[0]
        assert "4 group(s) of 1 core(s)" in failures[0] and "Run at most 4 worker(s)" in failures[0]
        assert len([w for w in _ts_workers(spec) if w["status"] == "READY"]) == 4
        # and TorchServe's own /ping stops saying Healthy once the retry timeout has passed
        ping = f"http://127.0.0.1:{spec['inference_port']}/ping"
        wait_for(lambda: requests.get(ping, timeout=10).status_code == 500, timeout=90,
                 what="/ping to report the failing worker")


def test_torchserve_two_cores_per_worker(tmp_path, neuronx_artifact):
    with serving(tmp_path, "torchserve", neuronx_artifact, 2, 2) as (spec, log):
        pids = [int(w["pid"]) for w in _ts_workers(spec)]
        seen = imports(log)
        assert sorted(seen[p]["NEURON_RT_VISIBLE_CORES"] for p in pids) == ["0-1", "2-3"]
        assert all(seen[p]["NEURON_RT_NUM_CORES"] == "2" for p in pids)


def test_triton_four_instances_four_cores(tmp_path, neuronx_artifact, classifier_dir):
    want = eager_classifier_scores(classifier_dir, TEXTS)
    with serving(tmp_path, "triton", neuronx_artifact, 4, 1) as (spec, log):
        seen = imports(log)
        assert sorted(v["NEURON_RT_VISIBLE_CORES"] for v in seen.values()) == ["0", "1", "2",
                                                                               "3"]
        client = httpclient.InferenceServerClient(f"127.0.0.1:{spec['http_port']}")
        t = httpclient.InferInput("TEXT", [len(TEXTS), 1], "BYTES")
        t.set_data_from_numpy(np.array([[s.encode()] for s in TEXTS], dtype=object))
        scores = client.infer(MODEL, [t]).as_numpy("SCORES")
        assert np.allclose(scores, want, atol=1e-5)
