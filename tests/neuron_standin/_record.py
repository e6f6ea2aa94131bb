"""Shared by the stand-ins: append one JSON line per event to $NEURONSERVE_STANDIN_LOG.

Only the tests put this directory on the path. It is a stand-in for the Neuron SDK,
which cannot exist on machines without Neuron hardware: it compiles with TorchScript
and records what it was called with and the Neuron variables of the process."""

import json
import os

NEURON_VARS = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURONCORE_GROUP_SIZES")


def record(event: str, **data) -> None:
    path = os.environ.get("NEURONSERVE_STANDIN_LOG")
    if not path:
        return
    data.update(event=event, pid=os.getpid(), env={k: os.environ.get(k) for k in NEURON_VARS})
    with open(path, "a") as f:
        f.write(json.dumps(data) + "\n")


def shapes(example):
    example = example if isinstance(example, tuple) else (example,)
    return [list(t.shape) for t in example]
