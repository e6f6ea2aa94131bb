"""Where the files neuronserve copies into archives live, and how to call the
servers' own command-line tools from this environment."""

from __future__ import annotations

import shutil
import sys
from importlib import resources
from pathlib import Path


def handler_file(name: str) -> Path:
    """A file from the repository's `handlers/` (installed as package data in
    `neuronserve/_handlers`, so wheel installs find it too)."""
    path = Path(str(resources.files("neuronserve._handlers") / name))
    if not path.is_file():
        raise FileNotFoundError(f"{name} is not installed with neuronserve (looked in {path})")
    return path


def triton_model_file() -> Path:
    """`triton_backend/model.py` (package data `neuronserve/_triton_backend`)."""
    path = Path(str(resources.files("neuronserve._triton_backend") / "model.py"))
    if not path.is_file():
        raise FileNotFoundError(f"model.py is not installed with neuronserve (looked in {path})")
    return path


def torchserve_log_config() -> Path:
    """The log4j2.xml `serve torchserve` starts TorchServe with (package data of
    `neuronserve.serve`; the file says how it differs from TorchServe's own)."""
    path = Path(str(resources.files("neuronserve.serve") / "torchserve_log4j2.xml"))
    if not path.is_file():
        raise FileNotFoundError(f"torchserve_log4j2.xml is not installed (looked in {path})")
    return path


def tool(command: str, module: str, function: str) -> list[str]:
    """argv prefix for a console script: the one beside this interpreter, else on PATH,
    else the entry point called through this interpreter."""
    beside = Path(sys.executable).parent / command
    if beside.is_file():
        return [str(beside)]
    found = shutil.which(command)
    if found:
        return [found]
    return [
        sys.executable,
        "-c",
        f"import sys; from {module} import {function} as f; "
        f"sys.argv[0] = {command!r}; sys.exit(f())",
    ]
