"""What `neuronserve bench` and `soak` need of Triton: its own API is KServe v2 over HTTP
and gRPC through tritonclient (binary tensors, as tritonclient sends them), and soak
speaks KServe v2 JSON to it."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import numpy as np

from ...load.endpoints import (
    AsyncHttpConnection,
    AsyncSend,
    Endpoint,
    RequestFailed,
    Send,
    raw_post,
)
from ...load.protocols import SoakProtocol
from ...load.work import Batch
from ...load.wrk import WrkRequest
from ...tensors import first_output
from ...tensors import of as tensors_of
from ..base import NativeRoute
from ..bench import EngineBench


class TritonEndpoint(Endpoint):
    """KServe v2 inference through tritonclient, HTTP or gRPC."""

    def __init__(
        self, label: str, protocol: str, url: str, model: str, headers: dict[str, str] | None = None
    ):
        super().__init__(label)
        self.headers = headers or {}  # an engine's key, where inference is behind one
        if protocol not in ("http", "grpc"):
            raise ValueError(f"unknown Triton protocol {protocol!r}")
        self.type, self.protocol, self.model = f"triton-{protocol}", protocol, model
        self.url = url.split("://", 1)[-1]  # tritonclient takes host:port
        if protocol == "http":
            # KServe v2 JSON on the shared event loop (see AsyncHttpConnection); gRPC goes
            # through tritonclient on one thread per client
            self.async_connect = self._async_connect

    def _binary_request(self, columns: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
        """KServe v2's binary tensor extension, as tritonclient builds it: a JSON header,
        then the tensors' bytes (images are not JSON strings); the body and its headers."""
        from tritonclient.http import InferenceServerClient

        body, json_size = InferenceServerClient.generate_request_body(
            _inputs(self.client_module("http"), columns)
        )
        headers = {
            **self.headers,
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(json_size),
        }
        return body, headers

    def wrk_request(self, payload: dict[str, np.ndarray]) -> WrkRequest | None:
        if self.protocol != "http":
            return None
        body, headers = self._binary_request(payload)
        return WrkRequest(f"http://{self.url}/v2/models/{self.model}/infer", body, headers)

    def _async_connect(self) -> AsyncSend:
        host, _, port = self.url.partition(":")
        conn = AsyncHttpConnection(host, int(port or 80))
        path = f"/v2/models/{self.model}/infer"
        built: dict[int, bytes] = {}

        async def send(columns: dict[str, np.ndarray]) -> None:
            raw = built.get(id(columns))
            if raw is None:
                body, headers = self._binary_request(columns)
                raw = built[id(columns)] = raw_post(host, int(port or 80), path, body, headers)
            status, data = await conn.request(raw)
            if status != 200:
                raise RequestFailed(f"HTTP {status}: {data[:200]!r}")

        return send

    def payload(self, batch: Batch) -> dict[str, np.ndarray]:
        return batch.columns

    @staticmethod
    def client_module(protocol: str) -> Any:
        if protocol == "http":
            import tritonclient.http as client
        else:
            import tritonclient.grpc as client
        return client

    def connect(self) -> Send:
        from tritonclient.utils import InferenceServerException

        client = self.client_module(self.protocol)
        c = client.InferenceServerClient(self.url)

        def send(columns: dict[str, np.ndarray]) -> None:
            try:
                c.infer(self.model, _inputs(client, columns), headers=self.headers)
            except InferenceServerException as e:
                raise RequestFailed(str(e)) from None

        return send


def _inputs(client: Any, columns: dict[str, np.ndarray]) -> list[Any]:
    inputs = []
    for name, values in columns.items():
        inp = client.InferInput(name, list(values.shape), "BYTES")
        inp.set_data_from_numpy(values)
        inputs.append(inp)
    return inputs


class KServeJson(SoakProtocol):
    """KServe v2 JSON on TEXT, answered by the task's first output tensor, which holds
    the model's rows: the task turns them into the same JSON the native answer is."""

    name = "triton"

    def body(self, texts: list[str]) -> bytes:
        tensor = {"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}
        return json.dumps({"inputs": [tensor]}).encode()

    def malformed_bodies(self, max_text_chars: int) -> list[bytes]:
        """Triton's own HTTP server answers JSON it cannot parse with 500 (and an empty
        body with an answer): that is its code, not neuronserve's, so these are bodies
        that parse."""
        tensor = '{"inputs": [{"name": "%s", "shape": %s, "datatype": "%s", "data": %s}]}'
        return [
            b'{"inputs": []}',
            (tensor % ("TEXT", "[1, 1]", "FP32", "[1.0]")).encode(),
            (tensor % ("NOPE", "[1, 1]", "BYTES", '["a"]')).encode(),
            (tensor % ("TEXT", "[2, 1]", "BYTES", '["a"]')).encode(),
        ]

    def served(self, data: bytes, texts: list[str], runner: Any) -> Any:
        manifest = runner.manifest
        name = first_output(manifest.task, manifest.output_dim, manifest.labels)
        out = next(o for o in json.loads(data)["outputs"] if o["name"] == name)
        rows = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        request = runner.task.parse(texts, {})
        results = tensors_of(manifest.task).decode(rows, runner.info)
        return runner.task.respond(results, request, runner.info)


class TritonBench(EngineBench):
    soak_protocols: ClassVar[dict[str, SoakProtocol]] = {KServeJson.name: KServeJson()}

    def endpoint(self, route: NativeRoute, label: str, headers: dict[str, str]) -> Endpoint:
        return TritonEndpoint(
            label, route.protocol.split("-", 1)[1], route.url, route.model, route.headers
        )

    def soak(self, route: NativeRoute, model: str) -> tuple[str, SoakProtocol]:
        return f"{route.url}/v2/models/{model}/infer", self.soak_protocols[KServeJson.name]


BENCH = TritonBench()
