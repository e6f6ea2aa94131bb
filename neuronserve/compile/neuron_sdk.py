"""What the two Neuron targets share: importing the SDK with one clear message when it
is missing, saving and loading the TorchScript modules that hold compiled NEFFs, where
they can run, and how many copies a multi-core worker keeps.

The SDK behaviour relied on, from the torch-neuronx tracing API page
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-trace.html):
- "Tracing can be performed on any EC2 machine ..., but inference can only be executed
  on a Neuron instance", and "upon torch.jit.load, it is loaded to a Neuron device": on a
  host without one, compiled modules are saved, not loaded (validation is pending until
  `neuronserve validate` runs on the serving host).
- "every Neuron traced model ScriptModule within a process is loaded to each available
  NeuronCore in round-robin order", and one call runs on the core its model was loaded
  to: a worker holding several cores keeps one copy per core, each placed with the
  placement API's neuron_cores_context at load
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-core-placement.html).
- Inputs and outputs are CPU tensors: "the Neuron traced ScriptModule expects to consume
  CPU tensors and produces CPU tensors".
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .. import cores
from .base import CompileError

INSTALL = {
    "torch_neuronx": "pip install 'neuronserve[neuronx]' --extra-index-url "
    "https://pip.repos.neuron.amazonaws.com",
    "torch_neuron": "see README 'Inf1 environment' (Python 3.10, torch 1.13.1): pip install "
    "'neuronserve[neuron]' --extra-index-url https://pip.repos.neuron.amazonaws.com",
}
# bytes per weight as the compiled graph holds it
WEIGHT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}


def import_sdk(name: str) -> ModuleType:
    """Import torch_neuronx / torch_neuron, or fail with the install command.

    Called only once a worker or compile has pinned itself: the Neuron runtime reads
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


def weight_bytes(model: torch.nn.Module, precision: str) -> int:
    return sum(p.numel() for p in model.parameters()) * WEIGHT_BYTES.get(precision, 4)


class NeuronTargetBase:
    """save/load, where modules can run and copies per worker, for both Neuron targets.
    Weights stay inlined in each bucket's NEFF (the SDK default): every bucket module
    carries them, on disk and on the device, and nothing is copied per call."""

    dynamic_shapes = False
    file_suffix = ".pt"
    sdk = ""
    # auto keeps the first precision that meets the floor: BF16 matmuls are the
    # NeuronCore's fast path, and a build host cannot time anything
    auto_times_candidates = False

    def versions(self) -> dict[str, str]:
        # the installed distribution's, or the module's once a compile imported it: the
        # artifact cache asks before a compile has pinned its NeuronCores, and the runtime
        # reads NEURON_RT_VISIBLE_CORES once, when it starts ("Neuron Runtime
        # configuration": https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/nrt-configurable-parameters.html)
        from .cache import installed

        module = sys.modules.get(self.sdk)
        found = installed(self.sdk.replace("_", "-")) or (sdk_version(module) if module else None)
        return {"compiler": f"{self.sdk} {found or 'unknown'}"}

    def save(self, compiled: torch.nn.Module, path: Path) -> None:
        torch.jit.save(compiled, str(path))

    def load(
        self, path: Path, core: int | None = None, data: bytes | None = None
    ) -> torch.nn.Module:
        sdk = import_sdk(self.sdk)  # registers the Neuron ops TorchScript needs
        source = io.BytesIO(data) if data is not None else str(path)
        if core is None:
            return torch.jit.load(source, map_location="cpu").eval()
        with sdk.experimental.neuron_cores_context(start_nc=core):
            return torch.jit.load(source, map_location="cpu").eval()

    def cannot_run_here(self, options: dict[str, Any]) -> str | None:
        if options.get("compile_for"):
            return f"compiled for {options['compile_for']} on a build host (--compile-for)"
        if not cores.neuron_device_present():
            return "this host has no Neuron device"
        return None

    def replicas(self, cores_per_worker: int, cores_per_module: int) -> int:
        return max(cores_per_worker // max(cores_per_module, 1), 1)

    @contextlib.contextmanager
    def compiling(self, options: dict[str, Any]) -> Iterator[None]:
        """Lease and pin one NeuronCore while this process compiles and checks modules,
        as a worker would: "By default, Neuron Runtime initializes all the cores present in
        the system and reserves them for the current process" (Neuron runtime
        configuration guide), which would take the host from its workers."""
        if self.cannot_run_here(options):
            yield
            return
        from .. import placement

        try:
            lease = placement.claim(
                "neuron",
                1,
                owner=f"compile (pid {os.getpid()})",
                neuron_cores=options.get("neuron_cores"),
            )
        except cores.NoFreeCoreGroup as e:
            raise CompileError(
                f"no NeuronCore free to compile and check on: {e}. Stop a "
                "worker, or compile with --compile-for on another host"
            ) from None
        try:
            with cores.neuron_pinned(lease.cores):
                yield
        finally:
            lease.release()
