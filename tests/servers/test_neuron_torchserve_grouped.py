"""Two TorchServe workers of two NeuronCores each on a fake 4-core Neuron host (stand-in
SDK): each worker's runtime sees one contiguous pair of cores, keeps a copy of every
bucket module on each, and runs a batch on both."""

from __future__ import annotations

import pytest
import requests
from helpers import NeuronServing, standin_events, standin_imports

pytestmark = pytest.mark.server


def test_two_cores_per_worker_used_together(tmp_path, neuronx_artifact):
    serving = NeuronServing(
        tmp_path,
        "torchserve",
        neuronx_artifact,
        name="tiny-neuronx",
        workers=2,
        cores_per_worker=2,
        batch_requests=1,
    )
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
        # the request's eight rows ran as two batches of four, one on each core of its worker
        assert len(served) == 2 and len({e["pid"] for e in served}) == 1
        assert len({e["core"] for e in served}) == 2
    finally:
        serving.stop()
