"""The native engine's section of the spec (`native:`): its store and its run folder (the
workers' sockets are there, a folder of the serving user's alone). Everything else is the
worker section's, as on the other engines: `workers` of `cores_per_worker` cores each,
each worker's queue (`max_queued`, `queue_timeout_ms`, `max_batch_delay_ms`) and
`response_timeout_s`, past which a worker still on one batch is taken for hung and
replaced."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from ...section import EngineSection, flags


class NativeSection(EngineSection):
    # no port: the front reaches each worker on a unix socket in the run folder
    key = "native"

    store_dir: Path = Field(
        Path("native_store"),
        description="the native engine's store",
        json_schema_extra=flags(role="store"),
    )
    run_dir: Path = Field(
        Path(".neuronserve/native"),
        description="where the native engine keeps its pid file, logs and its workers' sockets",
    )
