"""Triton's section of the spec (`triton:`): its model repository, its run folder, the
ports it listens on, and whether inference is behind its admin key too. Its instances
are the worker section's `workers`, each of `cores_per_worker` cores."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from pydantic import Field, field_validator

from ...section import EngineSection, flags

INSTALL = (
    "Triton is not installed: pip install 'neuronserve[triton]' (its tritonserver comes "
    "in the nvidia-pytriton wheel), or run inside NVIDIA's Triton container"
)


def glibc_refusal(version: str | None = None) -> str | None:
    """Why this system cannot run nvidia-pytriton's tritonserver, which needs glibc 2.35 or
    newer ("An operating system with glibc >= 2.35", PyTriton installation:
    https://triton-inference-server.github.io/pytriton/latest/installation/); Ubuntu 20.04
    images, the Neuron ones of SDK 2.20 and older included, have 2.31."""
    found = version or os.confstr("CS_GNU_LIBC_VERSION") or ""
    parts = found.replace("glibc", "").strip().split(".")
    if len(parts) >= 2 and (int(parts[0]), int(parts[1])) < (2, 35):
        return (
            f"this system has {found}; the Triton engine (nvidia-pytriton's tritonserver) "
            "needs glibc 2.35 or newer: use an Ubuntu 22.04 base image (for Neuron, a Neuron "
            "SDK 2.21+ deep learning container), or the TorchServe engine"
        )
    return None


class TritonSection(EngineSection):
    key = "triton"

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("tritonclient") is None:
            return INSTALL
        if shutil.which("tritonserver"):  # NVIDIA's container: its own, whatever glibc
            return None
        if importlib.util.find_spec("pytriton") is None:
            return INSTALL
        return glibc_refusal()

    repository: Path = Field(
        Path("triton_repo"),
        description="Triton model repository",
        json_schema_extra=flags(flat="triton_repository", role="store"),
    )
    run_dir: Path = Field(
        Path(".neuronserve/triton"),
        description="where tritonserver's pid file and log are kept",
        json_schema_extra=flags(flat="triton_run_dir"),
    )
    http_port: int = Field(
        8000, gt=0, lt=65536, description="Triton HTTP port", json_schema_extra=flags(role="port")
    )
    grpc_port: int = Field(
        8001, gt=0, lt=65536, description="Triton gRPC port", json_schema_extra=flags(role="port")
    )
    metrics_port: int = Field(
        8002,
        gt=0,
        lt=65536,
        description="Triton metrics port",
        json_schema_extra=flags(flat="triton_metrics_port", role="port"),
    )
    # behind the front: inference behind the admin key too (the front holds it)
    inference_key: bool = Field(
        False,
        description="Triton's inference API behind its admin key too (the front, which "
        "holds the key, starts it so; `serve triton` alone leaves inference open, as "
        "tritonclient users expect)",
        json_schema_extra=flags(flat="triton_inference_key", behind_front=True),
    )
    # a container of its own has no other local user to read the host's /dev/shm
    host_shm: bool = Field(
        False,
        description="where tritonserver cannot have a /dev/shm of its own (no CAP_SYS_ADMIN "
        "and no user namespaces), use the host's instead of refusing to start: only where "
        "every process that can see that /dev/shm runs as the serving user (a container of "
        "its own), since its Python backend passes requests there in regions others can "
        "open; the images set it",
        json_schema_extra=flags(in_container=True),
    )
    sagemaker: bool = Field(
        False,
        description="refused: Triton's own SageMaker listener binds 0.0.0.0 without "
        "authentication; `serve front --engine triton` answers /ping and /invocations",
    )

    @field_validator("sagemaker")
    @classmethod
    def _no_sagemaker_listener(cls, on: bool) -> bool:
        if on:
            raise ValueError(
                "Triton's own SageMaker listener binds 0.0.0.0 with no authentication "
                "(tritonserver has no option to bind it elsewhere); serve /ping and "
                "/invocations through neuronserve's front instead: `neuronserve serve front "
                "REPOSITORY --engine triton`"
            )
        return on
