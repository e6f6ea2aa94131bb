"""What `neuronserve bench` sends requests to, behind one small interface.

An endpoint builds a request body once per point (`payload`) and gives every load
thread its own connection (`connect`), a callable that sends one request and raises
`RequestFailed` unless the server answered with success. Clients are the ones users
use: `http.client` keep-alive connections for JSON over HTTP, `tritonclient` for
Triton, the Runner and the `transformers` pipeline called in this process.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np


class RequestFailed(RuntimeError):
    pass


Send = Callable[[Any], None]


class Endpoint:
    kind: str
    # in-process endpoints hold one model in this process: measured one request at a time
    in_process = False

    def __init__(self, label: str):
        self.label = label

    def payload(self, texts: list[str]) -> Any:
        raise NotImplementedError

    def connect(self) -> Send:
        raise NotImplementedError

    def close(self) -> None:
        pass


def json_body(texts: list[str]) -> bytes:
    return json.dumps({"inputs": texts[0] if len(texts) == 1 else texts}).encode()


class HttpJsonEndpoint(Endpoint):
    """POST {"inputs": ...} as JSON: TorchServe /predictions/<model> and SageMaker-style
    /invocations."""

    def __init__(self, label: str, kind: str, url: str, headers: dict[str, str] | None = None):
        super().__init__(label)
        self.kind, self.url = kind, url
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{label}: expected an http:// URL, got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def payload(self, texts: list[str]) -> bytes:
        return json_body(texts)

    def connect(self) -> Send:
        conn = [http.client.HTTPConnection(self.host, self.port, timeout=300)]

        def send(body: bytes) -> None:
            try:
                conn[0].request("POST", self.path, body, self.headers)
                resp = conn[0].getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as e:
                conn[0].close()  # a fresh connection for the next request
                conn[0] = http.client.HTTPConnection(self.host, self.port, timeout=300)
                raise RequestFailed(f"{type(e).__name__}: {e}") from None
            if resp.status != 200:
                raise RequestFailed(f"HTTP {resp.status}: {data[:200]!r}")

        return send


class TritonEndpoint(Endpoint):
    """KServe v2 inference through tritonclient, HTTP or gRPC."""

    def __init__(self, label: str, protocol: str, url: str, model: str):
        super().__init__(label)
        if protocol not in ("http", "grpc"):
            raise ValueError(f"unknown Triton protocol {protocol!r}")
        self.kind, self.protocol, self.model = f"triton-{protocol}", protocol, model
        self.url = url.split("://", 1)[-1]  # tritonclient takes host:port

    def payload(self, texts: list[str]) -> np.ndarray:
        return np.array([[t.encode()] for t in texts], dtype=object)

    def connect(self) -> Send:
        if self.protocol == "http":
            import tritonclient.http as client
        else:
            import tritonclient.grpc as client
        from tritonclient.utils import InferenceServerException

        c = client.InferenceServerClient(self.url)

        def send(texts: np.ndarray) -> None:
            inp = client.InferInput("TEXT", list(texts.shape), "BYTES")
            inp.set_data_from_numpy(texts)
            try:
                c.infer(self.model, [inp])
            except InferenceServerException as e:
                raise RequestFailed(str(e)) from None

        return send


class RunnerEndpoint(Endpoint):
    """The Runner in this process: the model without any server around it."""

    kind = "runner"
    in_process = True

    def __init__(self, label: str, artifact: Path):
        super().__init__(label)
        from ..runtime import Runner

        self.runner = Runner(artifact)

    def payload(self, texts: list[str]) -> bytes:
        return json_body(texts)

    def connect(self) -> Send:
        from ..tasks import RequestError

        def send(body: bytes) -> None:
            result = self.runner.handle([(body, "application/json")])[0]
            if isinstance(result, RequestError):
                raise RequestFailed(result.message)

        return send


class VanillaEndpoint(Endpoint):
    """The baseline the seeds measure: a `transformers` pipeline on the eager fp32 model,
    called with one request at a time."""

    kind = "vanilla"
    in_process = True

    def __init__(self, label: str, model_dir: Path, task: str):
        super().__init__(label)
        from transformers import pipeline

        self.pipe = pipeline(task, model=str(model_dir), tokenizer=str(model_dir), device="cpu")

    def payload(self, texts: list[str]) -> list[str] | str:
        return texts[0] if len(texts) == 1 else texts

    def connect(self) -> Send:
        return self.pipe
