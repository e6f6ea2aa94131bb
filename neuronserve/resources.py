"""Where the files neuronserve copies into archives live, and how to call the
servers' own command-line tools from this environment."""

from __future__ import annotations

import shutil
import sys
from importlib import resources
from pathlib import Path


def package_file(package: str, name: str) -> Path:
    """File `name` installed with neuronserve's package `package` (a server's adapter,
    package data such as `neuronserve._handlers`, mapped from the repository's top-level
    folders, so wheel installs find it too)."""
    path = Path(str(resources.files(package) / name))
    if not path.is_file():
        raise FileNotFoundError(f"{name} is not installed with neuronserve (looked in {path})")
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
