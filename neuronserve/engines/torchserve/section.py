"""TorchServe's section of the spec (`torchserve:`): its model store, its run folder, the
addresses it listens on, and what only TorchServe has (archive format, token
authorization, its batchSize, its worker retry)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Literal

from pydantic import Field

from ...section import EngineSection, flags

PORT = flags(role="port")


class TorchServeSection(EngineSection):
    key = "torchserve"

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("ts") is None:
            return "TorchServe is not installed: pip install 'neuronserve[torchserve]'"
        if shutil.which("java") is None:
            return "TorchServe needs Java 11 or newer: no java on PATH"
        return None

    model_store: Path = Field(
        Path("model_store"),
        description="TorchServe model store",
        json_schema_extra=flags(role="store"),
    )
    served_from: Path | None = Field(
        None,
        description="the folder TorchServe will find the store in, when not where it is "
        "written (KServe mounts it at /mnt/models/model-store): the paths its "
        "config.properties names (default: where it is written)",
    )
    run_dir: Path = Field(
        Path(".neuronserve/torchserve"),
        description="where TorchServe keeps its pid file, keys, logs and temp files",
    )
    # behind the front: a folder instead of a zip, so a start does not pack the artifact
    # again
    archive_format: Literal["default", "no-archive"] = Field(
        "default",
        description="default (.mar) or no-archive (a folder)",
        json_schema_extra=flags(behind_front="no-archive"),
    )
    # behind the front: token authorization, the front reading the keys from its 0700
    # run folder, the inference key living ten years instead of TorchServe's hour
    token_auth: bool = Field(
        True,
        description="TorchServe token authorization",
        json_schema_extra=flags("--token-auth/--no-token-auth", behind_front=True),
    )
    token_expiration_min: int = Field(
        60,
        ge=1,
        description="minutes TorchServe's inference key lives (TorchServe's default 60; the "
        "front, which holds the key, starts it with ten years)",
        json_schema_extra=flags(behind_front=10 * 365 * 24 * 60),
    )
    inference_port: int = Field(
        8080, gt=0, lt=65536, description="TorchServe inference port", json_schema_extra=PORT
    )
    management_port: int = Field(
        8081, gt=0, lt=65536, description="TorchServe management port", json_schema_extra=PORT
    )
    metrics_port: int = Field(
        8082, gt=0, lt=65536, description="TorchServe metrics port", json_schema_extra=PORT
    )
    # TorchServe always starts its gRPC endpoints too: two servers on one host need their own
    grpc_inference_port: int = Field(
        7070, gt=0, lt=65536, description="TorchServe gRPC inference port", json_schema_extra=PORT
    )
    grpc_management_port: int = Field(
        7071,
        gt=0,
        lt=65536,
        description="TorchServe gRPC management port",
        json_schema_extra=PORT,
    )
    batch_requests: int | None = Field(
        None,
        ge=1,
        description="TorchServe batchSize: requests one worker takes at once "
        "(default: the largest batch the artifact's bucket times say is worth forming)",
    )
    worker_retry_timeout_s: int = Field(
        60,
        ge=1,
        description="TorchServe /ping turns Unhealthy once a worker has failed to "
        "start for this long (maxRetryTimeoutInSec)",
    )
