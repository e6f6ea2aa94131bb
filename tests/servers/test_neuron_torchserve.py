"""NeuronCore placement across real TorchServe worker processes on a fake 4-core Neuron
host, with the stand-in SDK on the workers' path. The stand-in records
NEURON_RT_VISIBLE_CORES as each process saw it when it imported torch_neuronx, so
these tests show every worker pinned itself before the SDK loaded."""

from __future__ import annotations

import os
import signal

import pytest
import requests
from helpers import NeuronServing, standin_imports, wait_for

from neuronserve.serve import torchserve as ts

pytestmark = pytest.mark.server
MODEL = "tiny-neuronx"
TEXTS = ["fine", "not fine at all", "a somewhat longer sentence about the weather"]


@pytest.fixture(scope="module")
def serving(tmp_path_factory, neuronx_artifact):
    s = NeuronServing(
        tmp_path_factory.mktemp("neuron-ts"),
        "torchserve",
        neuronx_artifact,
        name=MODEL,
        workers=4,
        cores_per_worker=1,
        worker_retry_timeout_s=5,
    )
    yield s
    s.stop()


def workers(spec) -> list[dict]:
    url = f"http://127.0.0.1:{spec['management_port']}/models/{MODEL}"
    return list(requests.get(url, timeout=10).json()[0]["workers"])


def test_four_workers_on_four_distinct_cores_answer_like_the_runner(serving, neuronx_runner):
    ws = workers(serving.spec)
    pids = [int(w["pid"]) for w in ws]
    assert len(pids) == 4 and all(w["status"] == "READY" for w in ws)
    seen = standin_imports(serving.log)
    assert sorted(seen[p]["NEURON_RT_VISIBLE_CORES"] for p in pids) == ["0", "1", "2", "3"]
    assert all(seen[p]["NEURON_RT_NUM_CORES"] == "1" for p in pids)
    assert all(seen[p]["NEURONCORE_GROUP_SIZES"] is None for p in pids)  # Inf1 only
    body = {"inputs": TEXTS, "parameters": {"top_k": None}}
    r = requests.post(
        f"http://127.0.0.1:{serving.spec['inference_port']}/predictions/{MODEL}",
        json=body,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json() == neuronx_runner.responses_for_bodies([(body, None)])[0]


def test_a_killed_workers_replacement_takes_its_cores(serving):
    pids = [int(w["pid"]) for w in workers(serving.spec)]
    victim = pids[0]
    freed = standin_imports(serving.log)[victim]["NEURON_RT_VISIBLE_CORES"]
    os.kill(victim, signal.SIGKILL)

    def replacement():
        ready = [int(w["pid"]) for w in workers(serving.spec) if w["status"] == "READY"]
        new = set(ready) - set(pids)
        return len(ready) == 4 and new and new.pop()

    new_pid = wait_for(replacement, timeout=120, what="a replacement worker")
    assert standin_imports(serving.log)[new_pid]["NEURON_RT_VISIBLE_CORES"] == freed


def test_a_fifth_worker_fails_with_the_documented_error(serving):
    # last in the module: TorchServe 0.12 may start an untracked retry after a scale-down
    spec = serving.spec
    mgmt = f"http://127.0.0.1:{spec['management_port']}/models/{MODEL}"
    requests.put(f"{mgmt}?min_worker=5&max_worker=5", timeout=30)
    failures = wait_for(
        lambda: ts.worker_failures(serving.work / "ts" / "logs"),
        timeout=120,
        what="the fifth worker's failure",
    )
    assert "no free neuron core group" in failures[0]
    assert "4 group(s) of 1 core(s)" in failures[0] and "Run at most 4 worker(s)" in failures[0]
    assert len([w for w in workers(spec) if w["status"] == "READY"]) == 4
    # and TorchServe's own /ping stops saying Healthy once the retry timeout has passed
    ping = f"http://127.0.0.1:{spec['inference_port']}/ping"
    wait_for(
        lambda: requests.get(ping, timeout=10).status_code == 500,
        timeout=90,
        what="/ping to report the failing worker",
    )
