"""The front's HTTP protocol under clients that never finish: a connection whose headers
do not end within the header timeout, or that never begins a request, is closed, while
other clients are served meanwhile. A real uvicorn server on a socket, with the
protocol the front runs (protocol.py) and a one-route app. And its transport, which
sends what one turn of the event loop wrote in one send."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time

import pytest
import uvicorn
from helpers import free_port, wait_for
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from neuronserve.serve.front.protocol import _Corked, with_deadlines


@pytest.fixture
def server():
    app = Starlette(routes=[Route("/health", lambda _: PlainTextResponse("ok"))])
    port = free_port()
    uv = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http=with_deadlines(header_timeout_s=0.5, idle_timeout_s=1.0),
            log_level="warning",
        )
    )
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    while not uv.started:
        time.sleep(0.01)
    yield port
    uv.should_exit = True
    thread.join(10)


def closed(socks: list[socket.socket]) -> list[bool]:
    """Which of `socks` the server has closed, looked at once (a closed socket reads
    b"" at once; an open one has nothing to read)."""
    readable, _, _ = select.select(socks, [], [], 0.2)
    out = []
    for s in socks:
        if s not in readable:
            out.append(False)
            continue
        try:
            out.append(s.recv(1) == b"")
        except ConnectionResetError:
            out.append(True)
    return out


def get(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return s.recv(4096)


def test_a_client_that_never_finishes_its_headers_is_cut_off(server):
    slow = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", server), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line: never ends
        slow.append(s)
    silent = socket.create_connection(("127.0.0.1", server), timeout=5)  # sends nothing
    assert get(server).startswith(b"HTTP/1.1 200")  # served meanwhile
    assert not any(closed(slow))  # within the timeout, still open
    # closed once the header deadline (0.5 s) has passed; the silent one at its idle one (1 s)
    wait_for(lambda: all(closed(slow)), timeout=10, interval=0.1, what="slow clients cut")
    wait_for(lambda: closed([silent]) == [True], timeout=10, interval=0.1, what="silent one cut")
    assert get(server).startswith(b"HTTP/1.1 200")
    for s in [*slow, silent]:
        s.close()


class _Wire:
    """A transport that records each send."""

    def __init__(self) -> None:
        self.sends: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sends.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"the wire's {name}"


def test_an_answer_written_in_pieces_leaves_in_one_send_at_the_end_of_the_turn():
    async def scenario() -> tuple[list[list[bytes]], _Wire]:
        wire = _Wire()
        corked = _Corked(wire, asyncio.get_running_loop())  # type: ignore[arg-type]
        seen = []
        corked.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        corked.write(b"ok")
        seen.append(list(wire.sends))  # nothing sent within the turn
        await asyncio.sleep(0)
        seen.append(list(wire.sends))  # both pieces, one send
        corked.write(b"x" * (1 << 16))  # a turn's worth past the bound goes at once
        seen.append(list(wire.sends))
        corked.write(b"last words")
        corked.close()  # what is held leaves before the close
        seen.append(list(wire.sends))
        assert corked.get_extra_info("peername") == "the wire's peername"
        return seen, wire

    seen, wire = asyncio.run(scenario())
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    assert seen[0] == []
    assert seen[1] == [answer]
    assert seen[2] == [answer, b"x" * (1 << 16)]
    assert seen[3] == [answer, b"x" * (1 << 16), b"last words"] and wire.closed
