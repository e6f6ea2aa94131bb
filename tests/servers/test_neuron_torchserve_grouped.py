"""Two TorchServe workers of two NeuronCores each on a fake 4-core Neuron host (stand-in
SDK): each worker's runtime sees one contiguous pair of cores."""

from __future__ import annotations

import pytest
import requests
from helpers import NeuronServing, standin_imports

pytestmark = pytest.mark.server


def test_two_cores_per_worker(tmp_path, neuronx_artifact):
    serving = NeuronServing(
        tmp_path, "torchserve", neuronx_artifact, name="tiny-neuronx", workers=2, cores_per_worker=2
    )
    try:
        url = f"http://127.0.0.1:{serving.spec['management_port']}/models/tiny-neuronx"
        pids = [int(w["pid"]) for w in requests.get(url, timeout=10).json()[0]["workers"]]
        seen = standin_imports(serving.log)
        assert sorted(seen[p]["NEURON_RT_VISIBLE_CORES"] for p in pids) == ["0-1", "2-3"]
        assert all(seen[p]["NEURON_RT_NUM_CORES"] == "2" for p in pids)
    finally:
        serving.stop()
