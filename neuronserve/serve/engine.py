"""Engine control: one engine (TorchServe or Triton) serving one artifact on loopback
ports of its own, packaged for this host's worker plan and started with truthful
readiness. The SageMaker entrypoint runs it behind its front; bench starts one per
layout it measures.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import requests

from .. import placement
from ..artifact import read_manifest
from ..spec import DeploySpec, load_spec
from ..tasks import RequestError, decode_payload, get_task
from .process import free_ports

log = logging.getLogger(__name__)

ENGINES = ("torchserve", "triton")
_PORTS = (
    "inference_port",
    "management_port",
    "metrics_port",
    "http_port",
    "grpc_port",
    "triton_metrics_port",
    "grpc_inference_port",
    "grpc_management_port",
)


class Engine:
    """`engine` serving `artifact` from its own folders under `work`.

    `settings` are spec fields for this deployment (workers, cores_per_worker, layout,
    response_timeout_s, max_batch_delay_ms, ...); ports and folders are chosen here.
    """

    def __init__(self, engine: str, artifact: Path, work: Path, settings: dict[str, Any]):
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: choose {' or '.join(ENGINES)}")
        self.engine_name, self.work, self.artifact = engine, Path(work), Path(artifact)
        # packaging verifies the artifact's checksums when the engine starts
        self.manifest = read_manifest(artifact, verify=False)
        self.task = get_task(self.manifest.task)
        self.name = self.manifest.name
        self.spec: DeploySpec = load_spec(
            None,
            {
                "name": self.name,
                "artifact": artifact,
                "token_auth": False,
                "model_store": self.work / "store",
                "run_dir": self.work / "ts",
                "triton_repository": self.work / "repo",
                "triton_run_dir": self.work / "tr",
                **dict(zip(_PORTS, free_ports(len(_PORTS)), strict=True)),
                **settings,
            },
        )
        self.plan = placement.plan(placement.PlanRequest.of(self.spec, self.manifest))
        self.instance: Any = None

    def start(self) -> None:
        """Package for this host and start; returns once every worker is ready."""
        s = self.spec
        if self.engine_name == "torchserve":
            from ..packaging.torchserve import package_torchserve
            from . import torchserve

            package_torchserve(self.artifact, s)
            self.instance = torchserve.start(s.model_store, s.run_dir, log=self._log)
        else:
            from ..packaging.triton import package_triton
            from . import triton

            package_triton(self.artifact, s)
            listen = triton.Listen(s.http_port, s.grpc_port, s.triton_metrics_port)
            self.instance = triton.start(
                s.triton_repository, s.triton_run_dir, listen, log=self._log
            )

    def _log(self, message: str) -> None:
        log.info(message)

    def stop(self) -> None:
        if self.engine_name == "torchserve":
            from . import torchserve

            torchserve.stop(self.spec.run_dir, log=self._log)
        else:
            from . import triton

            triton.stop(self.spec.triton_run_dir, log=self._log)

    def root_pid(self) -> int | None:
        """The engine's main process (TorchServe's frontend, tritonserver), if running."""
        if self.instance is None:
            return None
        if self.engine_name == "torchserve":
            from .torchserve import server_pid

            return server_pid(self.spec.run_dir)
        pid: int | None = self.instance.pid()
        return pid

    @property
    def metrics_url(self) -> str:
        return str(self.instance.metrics_url)

    @property
    def predictions_url(self) -> str:
        """TorchServe's inference URL for this model."""
        return f"{self.instance.inference_url}/predictions/{self.name}"

    def invoke(self, body: bytes, content_type: str) -> tuple[int, Any]:
        """One JSON or plain-text request as TorchServe's API takes it: (status, JSON)."""
        if self.engine_name == "torchserve":
            r = requests.post(
                self.predictions_url,
                data=body,
                headers={"Content-Type": content_type},
                timeout=self.spec.response_timeout_s,
            )
            return r.status_code, r.json()
        try:
            inputs, parameters = decode_payload(body, content_type)
            request = self.task.parse(inputs, parameters)
            rows = self._triton_rows(request.texts)
        except RequestError as e:
            return e.status, {"code": e.status, "error": e.message}
        return 200, self.task.respond(rows, request, {"labels": self.manifest.labels})

    def _triton_rows(self, texts: list) -> np.ndarray:
        """Model output rows for `texts` through Triton's tensors, max_batch_size at a time."""
        import tritonclient.http as httpclient

        # One client per call: tritonclient's HTTP client is not safe across the front's
        # threads. Closed after, since tritonserver waits for open connections when it stops.
        client = httpclient.InferenceServerClient(
            self.instance.http_url.removeprefix("http://"),
            network_timeout=self.spec.response_timeout_s,
        )
        try:
            return self._triton_chunks(client, texts)
        finally:
            client.close()

    def _triton_chunks(self, client: Any, texts: list) -> np.ndarray:
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException

        output = "LOGITS" if self.manifest.labels else "EMBEDDING"
        rows = []
        step = self.manifest.grid.max_batch
        for start in range(0, len(texts), step):
            chunk = texts[start : start + step]
            columns = {"TEXT": [t[0] if isinstance(t, tuple) else t for t in chunk]}
            if any(isinstance(t, tuple) for t in chunk):
                columns["TEXT_PAIR"] = [t[1] for t in chunk]
            tensors = []
            for name, values in columns.items():
                t = httpclient.InferInput(name, [len(values), 1], "BYTES")
                t.set_data_from_numpy(np.array([[v.encode()] for v in values], dtype=object))
                tensors.append(t)
            try:
                rows.append(client.infer(self.name, tensors).as_numpy(output))
            except InferenceServerException as e:
                raise RequestError.from_engine(e.message(), int(e.status() or 500)) from None
        return np.concatenate(rows)
