"""Four Triton instances on a fake 4-core Neuron host (stand-in SDK): each instance's
stub imports the SDK pinned to its own core, and answers equal the Runner's."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from helpers import NeuronServing, standin_imports

pytestmark = pytest.mark.server
TEXTS = ["fine", "not fine at all", "a somewhat longer sentence about the weather"]


def test_four_instances_four_cores(tmp_path, neuronx_artifact, neuronx_runner):
    serving = NeuronServing(
        tmp_path, "triton", neuronx_artifact, name="tiny-neuronx", workers=4, cores_per_worker=1
    )
    try:
        seen = standin_imports(serving.log)
        assert sorted(v["NEURON_RT_VISIBLE_CORES"] for v in seen.values()) == ["0", "1", "2", "3"]
        client = httpclient.InferenceServerClient(f"127.0.0.1:{serving.spec['http_port']}")
        t = httpclient.InferInput("TEXT", [len(TEXTS), 1], "BYTES")
        t.set_data_from_numpy(np.array([[s.encode()] for s in TEXTS], dtype=object))
        [rows] = neuronx_runner.outputs([neuronx_runner.parse({"inputs": TEXTS})])
        assert np.array_equal(client.infer("tiny-neuronx", [t]).as_numpy("LOGITS"), rows)
    finally:
        serving.stop()
