"""What `neuronserve bench` sends requests to, behind one small interface.

An endpoint builds a request body once per point (`payload`) and gives every load
thread its own connection (`connect`), a callable that sends one request and raises
`RequestFailed` unless the server answered with success. Clients are the ones users
use: `http.client` keep-alive connections for JSON over HTTP, the Runner and the
`transformers` pipeline called in this process.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .work import Batch, Vanilla
from .wrk import WrkRequest


class RequestFailed(RuntimeError):
    pass


Send = Callable[[Any], None]
AsyncSend = Callable[[Any], Awaitable[None]]


class Endpoint:
    # set by endpoints whose clients all run on one asyncio loop (see load.py)
    async_connect: Callable[[], AsyncSend] | None = None

    # front, sagemaker, openai, runner, vanilla
    type: str
    # in-process endpoints hold one model in this process: measured one request at a time
    in_process = False
    # the session's baseline route (the front's /invocations): the other routes in that
    # session are reported as a ratio to this one
    baseline = False

    def __init__(self, label: str):
        self.label = label

    def payload(self, batch: Batch) -> Any:
        """One request as this endpoint sends it, built once per point."""
        raise NotImplementedError

    def connect(self) -> Send:
        raise NotImplementedError

    def wrk_request(self, payload: Any) -> WrkRequest | None:
        """`payload` as wrk sends it, where wrk can drive this endpoint (plain HTTP)."""
        return None

    def close(self) -> None:
        pass


def json_body(texts: list[str], field: str = "inputs") -> bytes:
    return json.dumps({field: texts[0] if len(texts) == 1 else texts}).encode()


class AsyncHttpConnection:
    """One keep-alive HTTP/1.1 connection driven by asyncio.

    All of a point's connections share one event loop on one thread, like wrk: on a
    2-core machine whose cores the server saturates, sixteen client threads each wait to
    be scheduled before they can read their response, which showed up as 25-40% lower
    throughput than wrk measured at the same point. Responses are read by Content-Length
    or chunked encoding; a server that closes the connection gets a new one.
    """

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _drop(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        try:
            if self.writer is None:
                await self._open()
            assert self.writer is not None and self.reader is not None
            self.writer.write(raw)
            status_line = await self.reader.readline()
            if not status_line:
                raise ConnectionError("server closed the connection")
            status = int(status_line.split()[1])
            length, chunked, close = await self._head(status_line.startswith(b"HTTP/1.0"))
            if chunked:
                body = await self._chunked()
            elif length is not None:
                body = await self.reader.readexactly(length)
            else:
                body, close = await self.reader.read(), True
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as e:
            self._drop()
            raise RequestFailed(f"{type(e).__name__}: {e}") from None
        if close:
            self._drop()
        return status, body

    async def _head(self, close: bool) -> tuple[int | None, bool, bool]:
        """(Content-Length, chunked, close the connection after) from the headers."""
        assert self.reader is not None
        length, chunked = None, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                return length, chunked, close
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value:
                chunked = True
            elif name == b"connection":
                close = value == b"close"

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        body = b""
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                return body
            body += chunk[:-2]

    def close(self) -> None:
        self._drop()


def raw_post(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class HttpJsonEndpoint(Endpoint):
    """POST {"inputs": ...} as JSON: TorchServe /predictions/<model>, SageMaker-style
    /invocations, the front's /embed; {"input": ...} (`field`) for OpenAI's /v1/embeddings."""

    def __init__(
        self,
        label: str,
        type_: str,
        url: str,
        headers: dict[str, str] | None = None,
        field: str = "inputs",
    ):
        super().__init__(label)
        self.type, self.url, self.field = type_, url, field
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{label}: expected an http:// URL, got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def payload(self, batch: Batch) -> bytes:
        return batch.native if self.field == "inputs" else json_body(batch.texts, self.field)

    def wrk_request(self, payload: bytes) -> WrkRequest:
        return WrkRequest(self.url, payload, self.headers)

    def async_connect(self) -> AsyncSend:
        """A coroutine function sending one request on its own connection (the load
        generator runs these on one event loop)."""
        conn = AsyncHttpConnection(self.host, self.port)
        built: dict[bytes, bytes] = {}

        async def send(body: bytes) -> None:
            raw = built.get(body)
            if raw is None:
                raw = built[body] = raw_post(self.host, self.port, self.path, body, self.headers)
            status, data = await conn.request(raw)
            if status != 200:
                raise RequestFailed(f"HTTP {status}: {data[:200]!r}")

        return send

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


class RunnerEndpoint(Endpoint):
    """The Runner in this process: the model without any server around it."""

    type = "runner"
    in_process = True

    def __init__(self, label: str, artifact: Path):
        super().__init__(label)
        from ..runtime import Runner

        self.runner = Runner(artifact)

    def payload(self, batch: Batch) -> bytes:
        return batch.native

    def connect(self) -> Send:
        from ..tasks import RequestError

        def send(body: bytes) -> None:
            result = self.runner.responses_for_bodies([(body, "application/json")])[0]
            if isinstance(result, RequestError):
                raise RequestFailed(result.message)

        return send


class VanillaEndpoint(Endpoint):
    """The baseline the seeds measure: a `transformers` pipeline on the eager fp32 model,
    called with one request at a time (work.Vanilla: what it is for each task)."""

    type = "vanilla"
    in_process = True

    def __init__(self, label: str, model_dir: Path, task: str):
        super().__init__(label)
        self.pipe = Vanilla(model_dir, task)

    def payload(self, batch: Batch) -> Any:
        return self.pipe.arguments(batch)

    def connect(self) -> Send:
        return self.pipe

    def plain_loop(self, payload: Any, seconds: float, min_calls: int) -> float:
        """Calls per second of the pipeline in a bare loop on this thread, after three
        warm-up calls: the baseline as anyone would time it, with no load generator, to
        check that the vanilla endpoint's figure is not lowered by the harness."""
        for _ in range(3):
            self.pipe(payload)
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds or calls < min_calls:
            self.pipe(payload)
            calls += 1
        return calls / (time.perf_counter() - t0)
