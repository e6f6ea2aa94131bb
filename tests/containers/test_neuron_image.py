"""The Neuron image's stack: its base is the last AWS Neuron container that carries the XLA
torch-neuronx Inf2 and Trn1 run, and every Python requirement the image adds has a wheel
for that image's Python and platform (pip resolves them as the image's own pip would,
without building anything). The image itself needs AWS's registry and an Inf2 host."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from neuronserve.platforms.sagemaker.context import requirements

DOCKERFILE = REPO / "neuronserve" / "platforms" / "sagemaker" / "files" / "Dockerfile.neuronx"
# Neuron 2.31.1's PyTorch inference image (aws-neuron/deep-learning-containers README):
# PyTorch 2.9, torch-neuronx 2.9.0.2.15.32035, Python 3.12, Ubuntu 24.04 (glibc 2.39)
BASE = "public.ecr.aws/neuron/pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04"
PYTHON, GLIBC = "3.12", 39


def test_the_neuron_image_bases_on_the_last_container_with_xla_torch_neuronx():
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert default is not None and default.group(1) == BASE
    assert f"py{PYTHON.replace('.', '')}" in BASE and "ubuntu24.04" in BASE


def test_every_requirement_of_the_neuron_image_has_a_wheel_for_its_python(tmp_path):
    """`pip install --dry-run --only-binary=:all:` for Python 3.12 on manylinux up to
    glibc 2.39, from PyPI (not this host's own indexes or constraints): nothing the
    image installs would need a compiler it does not have."""
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("\n".join(requirements("neuronx")) + "\n")
    platforms = [f"manylinux_2_{v}_x86_64" for v in range(GLIBC, 16, -1)]
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--quiet",
           "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp",
           *(a for p in [*platforms, "manylinux2014_x86_64"] for a in ("--platform", p)),
           "--target", str(tmp_path / "never"), "--report", str(report),
           "-r", str(reqs)]  # fmt: skip
    cert = _pip_cert()
    if cert:
        cmd[4:4] = ["--cert", cert]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode and "NewConnectionError" in done.stderr + done.stdout:
        pytest.skip("PyPI is not reachable from here")
    assert done.returncode == 0, done.stderr[-3000:]
    installed = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}
    assert {"transformers", "tokenizers", "numpy", "uvicorn", "pydantic"} <= installed
    assert "torch" not in installed  # the base's own, built for torch-neuronx


def _pip_cert() -> str | None:
    """The CA bundle this host's pip trusts (a TLS-intercepting proxy's), which
    `--isolated` would otherwise leave out."""
    import os

    found = os.environ.get("PIP_CERT")
    if found and Path(found).is_file():
        return found
    done = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.cert"],
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip() or None
