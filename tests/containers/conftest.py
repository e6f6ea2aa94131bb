"""The container tier: images built from what `neuronserve package` writes, with the
build command the guides show, and run as SageMaker and a kubelet run them.

A docker engine is started when none answers (and stopped at the end: only the one this
run started). No registry is reachable here, so the Dockerfile's default base
(`python:3.11-slim`: Debian bookworm with Python 3.11) is stood in for by a local image
made once with debootstrap and `docker import`, and reused by later runs. pip inside a
build goes through whatever TLS-intercepting proxy this host has: the host's CA bundle
(PIP_CERT) is handed to the build as the documented build argument, never written into
the Dockerfile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import run_cli
from images import docker

BASE = "neuronserve-test/python:3.11-slim"
DEBIAN = "http://deb.debian.org/debian"
# where PyPI's torch wheel is the CPU one (the PyTorch index is not reachable here)
TORCH_INDEX = os.environ.get("NEURONSERVE_TEST_TORCH_INDEX", "https://pypi.org/simple")


def _answers() -> bool:
    try:
        return docker("info", check=False, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def engine() -> Iterator[None]:
    """A docker engine that answers: this host's, or one started here and stopped after."""
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI (apt-get install docker.io)")
    if _answers():
        yield
        return
    if shutil.which("dockerd") is None or os.getuid() != 0:
        pytest.skip("no docker engine answers, and none can be started here (root, dockerd)")
    log = open(Path(tempfile.gettempdir()) / "neuronserve-test-dockerd.log", "w")  # noqa: SIM115
    daemon = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _answers():
            if daemon.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dockerd did not start: see {log.name}")
            time.sleep(0.5)
        yield
    finally:
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()


@pytest.fixture(scope="session")
def base_image(engine: None) -> str:
    """The stand-in for python:3.11-slim: Debian bookworm's own Python 3.11 (3.11.2,
    which has no tarfile extraction filters) with pip, made once per host."""
    if docker("image", "inspect", BASE, check=False).returncode == 0:
        return BASE
    if shutil.which("debootstrap") is None:
        pytest.skip("no local base image and no debootstrap to make one (apt-get install)")
    with tempfile.TemporaryDirectory(prefix="ns-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=python3,python3-pip,ca-certificates",
             "bookworm", str(root), DEBIAN],
            check=True, capture_output=True, timeout=900,
        )  # fmt: skip
        # as the python image's: pip installs into the system Python (no PEP 668 marker)
        for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
            marker.unlink()
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(root / cache, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            ["docker", "import", "--change", 'CMD ["python3"]', "-", BASE],
            stdin=tar.stdout, check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        tar.wait()
    return BASE


def build_args(base: str) -> list[str]:
    """The documented build arguments: the base, where torch comes from, and the CA
    certificates this host's pip trusts beyond pip's own bundle (a TLS-intercepting
    proxy's, when PIP_CERT names a bundle)."""
    args = ["--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"TORCH_INDEX_URL={TORCH_INDEX}"]
    extra = _extra_certificates(os.environ.get("PIP_CERT"))
    if extra:
        args += ["--build-arg", f"PIP_CERT_PEM={extra}"]
    return args


def _extra_certificates(bundle: str | None) -> str:
    """The certificates of `bundle` that pip's own (certifi's) does not hold."""
    import re

    import pip._vendor.certifi as certifi

    if not bundle or not Path(bundle).is_file():
        return ""
    pem = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)
    known = {c.replace("\n", "") for c in pem.findall(Path(certifi.where()).read_text())}
    return "\n".join(
        c for c in pem.findall(Path(bundle).read_text()) if c.replace("\n", "") not in known
    )


@pytest.fixture(scope="session")
def cpu_context(tmp_path_factory: pytest.TempPathFactory, minilm_artifact: Path) -> Path:
    """What `neuronserve package sagemaker` writes for MiniLM, as the guide runs it."""
    out = tmp_path_factory.mktemp("image") / "build"
    run_cli("package", "sagemaker", minilm_artifact, "--target", "cpu", "--out", out)
    return out


@pytest.fixture(scope="session")
def cpu_image(base_image: str, cpu_context: Path) -> str:
    """The SageMaker CPU image, built as the guide says:
    `docker build -t IMAGE [--build-arg ...] build/`."""
    image = "neuronserve-test/minilm:cpu"
    built = docker("build", "-t", image, *build_args(base_image), str(cpu_context),
                   check=False, timeout=1800)  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    return image
