"""NeuronCore placement across real TorchServe workers and Triton instances on a fake
4-core Neuron host, with the stand-in SDK on the workers' path, serving two models (the
tiny neuronx classifier under two names), each server started as its users start it on
what `neuronserve package` wrote. The stand-in records NEURON_RT_VISIBLE_CORES
as each process saw it when it imported torch_neuronx, and every module load with the
core it went to: every worker pinned itself before the SDK loaded, loaded both models
onto its own cores, and no NeuronCore was loaded by two processes."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from helpers import NeuronServing, standin_events, standin_imports, wait_for

from neuronserve.worker import FAILURE_MARKER

pytestmark = pytest.mark.server
STACK = "pair"
TEXTS = ["fine", "not fine at all", "a somewhat longer sentence about the weather"]


def same_rows(got, rows) -> bool:
    """The rows computed in process, to float32's last bits: a batch of other
    composition sums in another order on some CPUs (seen: 2e-9 on an Intel host with
    AMX), while another text's row differs by far more."""
    return got.shape == rows.shape and bool(np.allclose(got, rows, rtol=0, atol=1e-5))


def two_models(artifact) -> list[dict]:
    return [
        {"artifact": str(artifact), "name": "first"},
        {"artifact": str(artifact), "name": "second"},
    ]


@pytest.fixture(scope="module")
def serving(tmp_path_factory, neuronx_artifact):
    s = NeuronServing(
        tmp_path_factory.mktemp("neuron-ts"),
        "torchserve",
        models=two_models(neuronx_artifact),
        deployment_name=STACK,
        workers=4,
        cores_per_worker=1,
        worker_retry_timeout_s=5,
    )
    yield s
    s.stop()


def workers(spec) -> list[dict]:
    url = f"http://127.0.0.1:{spec['management_port']}/models/{STACK}"
    return list(requests.get(url, timeout=10).json()[0]["workers"])


def worker_failures(log_dir) -> list[str]:
    path = log_dir / "model_log.log"
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return [ln.split(FAILURE_MARKER)[-1].strip() for ln in lines if FAILURE_MARKER in ln]


def live_stubs(serving) -> set[int]:
    return {p.pid for p in serving.server.running("triton_python_backend_stub")}


def loads_by_core(log, pids) -> dict[int, set[int]]:
    """Which processes loaded modules onto each NeuronCore."""
    out: dict[int, set[int]] = defaultdict(set)
    for e in standin_events(log, "load"):
        if e["pid"] in pids:
            out[e["core"]].add(e["pid"])
    return out


def test_four_workers_on_four_distinct_cores_hold_both_models(serving, neuronx_runner):
    ws = workers(serving.spec)
    pids = [int(w["pid"]) for w in ws]
    assert len(pids) == 4 and all(w["status"] == "READY" for w in ws)  # workers = core groups
    seen = standin_imports(serving.log)
    assert sorted(seen[p]["NEURON_RT_VISIBLE_CORES"] for p in pids) == ["0", "1", "2", "3"]
    assert all(seen[p]["NEURON_RT_NUM_CORES"] == "1" for p in pids)
    assert all(seen[p]["NEURONCORE_GROUP_SIZES"] is None for p in pids)  # Inf1 only
    # each core: one process, which loaded both models' four bucket modules onto it
    by_core = loads_by_core(serving.log, set(pids))
    assert sorted(by_core) == [0, 1, 2, 3] and all(len(p) == 1 for p in by_core.values())
    loads = standin_events(serving.log, "load")
    assert all(sum(e["pid"] == pid for e in loads) == 2 * 4 for pid in pids)
    body = {"inputs": TEXTS, "parameters": {"top_k": None}}
    url = f"http://127.0.0.1:{serving.spec['inference_port']}/predictions/{STACK}"
    for model in ("first", "second"):
        r = requests.post(url, json=body, headers={"X-Neuronserve-Model": model}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json() == neuronx_runner.responses_for_bodies([(body, None)])[0]


def test_a_killed_workers_replacement_takes_its_cores_with_both_models(serving):
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
    mine = [e for e in standin_events(serving.log, "load") if e["pid"] == new_pid]
    assert len(mine) == 2 * 4 and {e["core"] for e in mine} == {int(freed)}
    # the runtime never refused a core: the replacement waited for the dead one's
    assert standin_events(serving.log, "core_busy") == []


def test_a_fifth_worker_fails_with_the_documented_error(serving):
    # last in the module: TorchServe 0.12 may start an untracked retry after a scale-down
    spec = serving.spec
    mgmt = f"http://127.0.0.1:{spec['management_port']}/models/{STACK}"
    requests.put(f"{mgmt}?min_worker=5&max_worker=5", timeout=30)
    failures = wait_for(
        lambda: worker_failures(serving.work / "ts" / "logs"),
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


def test_two_cores_per_worker_used_together(tmp_path, neuronx_artifact):
    """Two TorchServe workers of two NeuronCores each: each worker's runtime sees one
    contiguous pair of cores, keeps a copy of every bucket module on each, and runs a
    batch on both."""
    serving = NeuronServing(
        tmp_path, "torchserve", artifact=neuronx_artifact, name="tiny-neuronx", workers=2,
        cores_per_worker=2, batch_requests=1,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{serving.spec['management_port']}/models/tiny-neuronx"
        pids = [int(w["pid"]) for w in requests.get(url, timeout=10).json()[0]["workers"]]
        seen = standin_imports(serving.log)
        assert sorted(seen[p]["NEURON_RT_VISIBLE_CORES"] for p in pids) == ["0-1", "2-3"]
        assert all(seen[p]["NEURON_RT_NUM_CORES"] == "2" for p in pids)
        loads = standin_events(serving.log, "load")
        for pid in pids:  # one copy of each bucket module per core
            assert len({e["core"] for e in loads if e["pid"] == pid}) == 2
        before = len(standin_events(serving.log, "execute"))
        body = {"inputs": [f"text number {i}" for i in range(8)]}
        predict = f"http://127.0.0.1:{serving.spec['inference_port']}/predictions/tiny-neuronx"
        assert requests.post(predict, json=body, timeout=60).status_code == 200
        served = standin_events(serving.log, "execute")[before:]
        # the request's eight rows ran on both cores of its worker (in the buckets their
        # measured times make cheapest: two of four, or more when the compile was busy)
        assert len(served) >= 2 and len({e["pid"] for e in served}) == 1
        assert len({e["core"] for e in served}) == 2
    finally:
        serving.stop()


def test_four_triton_instances_on_four_cores_hold_both_models(
    tmp_path, neuronx_artifact, neuronx_runner
):
    serving = NeuronServing(
        tmp_path, "triton", models=two_models(neuronx_artifact), deployment_name=STACK,
        workers=4, cores_per_worker=1,
    )  # fmt: skip
    try:
        live = live_stubs(serving)
        seen = {pid: v for pid, v in standin_imports(serving.log).items() if pid in live}
        assert sorted(v["NEURON_RT_VISIBLE_CORES"] for v in seen.values()) == ["0", "1", "2", "3"]
        by_core = loads_by_core(serving.log, set(seen))
        assert sorted(by_core) == [0, 1, 2, 3] and all(len(p) == 1 for p in by_core.values())
        client = httpclient.InferenceServerClient(serving.server.url.removeprefix("http://"))
        t = httpclient.InferInput("TEXT", [len(TEXTS), 1], "BYTES")
        t.set_data_from_numpy(np.array([[s.encode()] for s in TEXTS], dtype=object))
        [rows] = neuronx_runner.outputs([neuronx_runner.parse({"inputs": TEXTS})])
        for model in ("first", "second"):
            got = client.infer(STACK, [t], parameters={"model": model}).as_numpy("LOGITS")
            assert same_rows(got, rows)
        client.close()
    finally:
        serving.stop()


@pytest.mark.parametrize("in_flight", [2, 1])
def test_a_triton_instance_takes_its_next_batch_while_the_device_runs_one(
    tmp_path, neuronx_artifact, neuronx_runner, monkeypatch, in_flight
):
    """One instance on one NeuronCore whose calls take 150 ms (the stand-in's device time,
    a test's own table). With two batches in flight (the default) each `execute` returns
    once its batch is queued for the device, long before the device is done (Triton's
    own statistics), so the instance takes the next batch meanwhile; with one it waits
    for the device. Either way each request is answered after the device's time, with
    its own rows."""
    table = {"seq": 16, "batch_ms": {"1": 150, "8": 300}}
    monkeypatch.setenv("NEURON_STANDIN_DEVICE_TIME", json.dumps(table))
    serving = NeuronServing(
        tmp_path, "triton", models=[{"artifact": str(neuronx_artifact), "name": "alone"}],
        workers=1, cores_per_worker=1, batches_in_flight=in_flight,
    )  # fmt: skip
    try:
        url = serving.server.url.removeprefix("http://")
        [rows] = neuronx_runner.outputs([neuronx_runner.parse({"inputs": TEXTS})])

        def ask() -> tuple[float, bool]:
            client = httpclient.InferenceServerClient(url)
            t = httpclient.InferInput("TEXT", [len(TEXTS), 1], "BYTES")
            t.set_data_from_numpy(np.array([[s.encode()] for s in TEXTS], dtype=object))
            started = time.monotonic()
            got = client.infer("alone", [t]).as_numpy("LOGITS")
            client.close()
            return time.monotonic() - started, same_rows(got, rows)

        assert ask()[1]  # computed once; from now on the same call holds the core
        alone = [ask() for _ in range(4)]
        assert all(right for _, right in alone)
        assert min(took for took, _ in alone) >= 0.1  # the device's time was paid
        client = httpclient.InferenceServerClient(url)
        stats = client.get_inference_statistics("alone")
        stats = stats["model_stats"][0]
        client.close()
        compute = stats["inference_stats"]["compute_infer"]
        assert stats["execution_count"] >= 2
        per_request_ms = int(compute["ns"]) / int(compute["count"]) / 1e6
        # ms, not the device's 150 ms; or all of them
        assert per_request_ms < 50 if in_flight == 2 else per_request_ms >= 100
        # several clients: batches of several requests (a third waits in `execute` for a
        # slot), each request answered with its own rows
        with ThreadPoolExecutor(4) as pool:
            assert all(right for _, right in pool.map(lambda _: ask(), range(8)))
    finally:
        serving.stop()
