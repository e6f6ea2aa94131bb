"""The front's settings, taken in one place from the three sections of the deployment
spec it reads: front, limits and multi-model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...spec import FrontSection, LimitsSection, MultiModelSection
from ...tasks.base import RequestLimits
from .keys import Keys, resolve_admin_keys, resolve_keys

# longest a model's load may take on every worker (multi-model) before it is called failed
LOAD_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class FrontConfig:
    address: str
    port: int
    run_dir: Path
    keys: Keys | None  # None: requests need no key
    max_body_bytes: int
    max_answer_bytes: int
    max_client_batch: int
    max_json_depth: int
    split_client_batches: bool
    max_in_flight: int
    deadline_s: float
    keep_alive_s: float
    header_timeout_s: float
    max_connections: int
    tls_cert: Path | None = None
    tls_key: Path | None = None
    metrics_auth: bool = True
    # SageMaker's container contract: no key, /ping and /invocations on its port
    sagemaker: bool = False
    # multi-model outside SageMaker: the keys of the model management routes
    admin_keys: Keys | None = None
    # multi-model: what each worker may fill with models (None: what the host has), and
    # how long a model may idle before it is unloaded (None: until room is needed)
    memory_budget_mb: float | None = None
    idle_unload_s: float | None = None
    multi_model: bool = False
    # what the root answers for when a request names no model and several could
    default_model: str | None = None
    # where traces go over OTLP (None: no traces), how, and under which service name
    otlp_endpoint: str | None = None
    otlp_protocol: str | None = None
    otlp_service_name: str | None = None

    @classmethod
    def of(
        cls,
        front: FrontSection,
        limits: LimitsSection,
        multi_model: MultiModelSection,
        sagemaker: bool = False,
    ) -> FrontConfig:
        return cls(
            address=front.address,
            port=front.port,
            run_dir=Path(front.run_dir).resolve(),
            keys=resolve_keys(front, sagemaker),
            max_body_bytes=limits.max_body_bytes,
            max_answer_bytes=limits.max_answer_bytes,
            max_client_batch=limits.max_client_batch,
            max_json_depth=limits.max_json_depth,
            split_client_batches=front.split_client_batches,
            max_in_flight=front.max_in_flight,
            deadline_s=front.deadline_s,
            keep_alive_s=front.keep_alive_s,
            header_timeout_s=front.header_timeout_s,
            max_connections=front.max_connections,
            tls_cert=front.tls_cert,
            tls_key=front.tls_key,
            metrics_auth=front.metrics_auth,
            sagemaker=sagemaker,
            admin_keys=resolve_admin_keys(front, multi_model, sagemaker),
            memory_budget_mb=multi_model.memory_budget_mb,
            idle_unload_s=multi_model.idle_unload_s,
            multi_model=multi_model.enabled,
            default_model=front.default_model,
            otlp_endpoint=front.otlp_endpoint,
            otlp_protocol=front.otlp_protocol,
            otlp_service_name=front.otlp_service_name,
        )

    @property
    def answer_limits(self) -> RequestLimits:
        """What the front holds a request's answer to (the workers' own limit)."""
        return RequestLimits(answer_bytes=self.max_answer_bytes)

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    @property
    def url(self) -> str:
        """Where a client on this host reaches the front."""
        host = "127.0.0.1" if self.address in ("0.0.0.0", "") else self.address
        host = "[::1]" if host == "::" else (f"[{host}]" if ":" in host else host)
        return f"{self.scheme}://{host}:{self.port}"
