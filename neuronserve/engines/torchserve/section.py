"""TorchServe's section of the spec (`torchserve:`): its model store, its run folder, the
addresses it listens on, and what only TorchServe has (archive format, token
authorization, its batchSize, its worker retry)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from ...section import EngineSection, flags


class TorchServeSection(EngineSection):
    key = "torchserve"
    store_field = "model_store"
    port_fields = (
        "inference_port",
        "management_port",
        "metrics_port",
        "grpc_inference_port",
        "grpc_management_port",
    )

    # behind the front: token authorization, the front reading the keys from its 0700 run
    # folder, the inference key living ten years instead of TorchServe's hour; a folder
    # instead of a zip, so a start does not pack the artifact again. TorchServe batches
    # the front's requests itself (its batchSize counts requests; the front joins none
    # for it: coalescing.py)
    behind_front: ClassVar[dict[str, Any]] = {
        "token_auth": True,
        "token_expiration_min": 10 * 365 * 24 * 60,
        "archive_format": "no-archive",
    }

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("ts") is None:
            return "TorchServe is not installed: pip install 'neuronserve[torchserve]'"
        if shutil.which("java") is None:
            return "TorchServe needs Java 11 or newer: no java on PATH"
        return None

    model_store: Path = Field(Path("model_store"), description="TorchServe model store")
    run_dir: Path = Field(
        Path(".neuronserve/torchserve"),
        description="where TorchServe keeps its pid file, keys, logs and temp files",
    )
    archive_format: Literal["default", "no-archive"] = Field(
        "default", description="default (.mar) or no-archive (a folder)"
    )
    token_auth: bool = Field(
        True,
        description="TorchServe token authorization",
        json_schema_extra=flags("--token-auth/--no-token-auth"),
    )
    token_expiration_min: int = Field(
        60,
        ge=1,
        description="minutes TorchServe's inference key lives (TorchServe's default 60; the "
        "front, which holds the key, starts it with ten years)",
    )
    inference_port: int = Field(8080, gt=0, lt=65536, description="TorchServe inference port")
    management_port: int = Field(8081, gt=0, lt=65536, description="TorchServe management port")
    metrics_port: int = Field(8082, gt=0, lt=65536, description="TorchServe metrics port")
    # TorchServe always starts its gRPC endpoints too: two servers on one host need their own
    grpc_inference_port: int = Field(
        7070, gt=0, lt=65536, description="TorchServe gRPC inference port"
    )
    grpc_management_port: int = Field(
        7071, gt=0, lt=65536, description="TorchServe gRPC management port"
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
