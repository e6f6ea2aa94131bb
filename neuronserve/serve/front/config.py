"""The front's settings, taken from the deployment spec in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...spec import DeploySpec
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

    @classmethod
    def from_spec(cls, spec: DeploySpec, sagemaker: bool = False) -> FrontConfig:
        return cls(
            address=spec.front_address,
            port=spec.front_port,
            run_dir=Path(spec.front_run_dir).resolve(),
            keys=resolve_keys(spec, sagemaker),
            max_body_bytes=spec.max_body_bytes,
            max_answer_bytes=spec.max_answer_bytes,
            max_client_batch=spec.max_client_batch,
            split_client_batches=spec.split_client_batches,
            max_in_flight=spec.max_in_flight,
            deadline_s=spec.deadline_s,
            keep_alive_s=spec.keep_alive_s,
            header_timeout_s=spec.header_timeout_s,
            max_connections=spec.max_connections,
            tls_cert=spec.tls_cert,
            tls_key=spec.tls_key,
            metrics_auth=spec.metrics_auth,
            sagemaker=sagemaker,
            admin_keys=resolve_admin_keys(spec, sagemaker),
            memory_budget_mb=spec.memory_budget_mb,
            idle_unload_s=spec.idle_unload_s,
            multi_model=spec.multi_model,
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
