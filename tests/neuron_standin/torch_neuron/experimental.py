"""torch_neuron.experimental (stand-in): the placement API (PyTorch Neuron (torch-neuron)
Core Placement API)."""

from _standin_runtime import neuron_cores_context

__all__ = ["neuron_cores_context"]
