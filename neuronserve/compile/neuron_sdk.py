"""What the two Neuron targets share: importing the SDK with one clear message when it
is missing, and saving/loading TorchScript modules that hold compiled NEFFs."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import torch

from .base import CompileError

INSTALL = {
    "torch_neuronx": "pip install 'neuronserve[neuronx]' --extra-index-url "
    "https://pip.repos.neuron.amazonaws.com",
    "torch_neuron": "pip install 'neuronserve[neuron]' --extra-index-url "
    "https://pip.repos.neuron.amazonaws.com",
}


def import_sdk(name: str) -> ModuleType:
    """Import torch_neuronx / torch_neuron, or fail with the install command.

    Called only once a worker has pinned itself: the Neuron runtime reads
    NEURON_RT_VISIBLE_CORES when it initialises.
    """
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise CompileError(
            f"the {name} package (AWS Neuron SDK) is not installed in this environment: "
            f"{INSTALL[name]}   ({e})"
        ) from None


def sdk_version(module: ModuleType) -> str:
    return str(getattr(module, "__version__", "unknown"))


class TorchScriptNeuronModule:
    """save/load shared by both Neuron targets: compiled modules are TorchScript."""

    dynamic_shapes = False
    core_kind = "neuron"
    file_suffix = ".pt"
    sdk = ""
    weights_file: str | None = None

    def save(self, compiled: torch.nn.Module, path: Path) -> None:
        torch.jit.save(compiled, str(path))

    def load(self, path: Path) -> torch.nn.Module:
        import_sdk(self.sdk)  # registers the Neuron ops TorchScript needs to deserialise
        # Inputs stay on the host: the compiled graph moves them to the NeuronCore itself.
        return torch.jit.load(str(path), map_location="cpu").eval()
