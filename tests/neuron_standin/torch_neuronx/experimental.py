"""torch_neuronx.experimental (stand-in): the placement API."""

from _standin_runtime import neuron_cores_context

__all__ = ["neuron_cores_context"]
