"""The front's HTTP protocol: uvicorn's httptools protocol with deadlines for what a
client has not sent yet, writing each answer in one send.

uvicorn closes a connection that idles between requests (`timeout_keep_alive`) but not
one that was opened and never sent a byte, nor one whose request headers never end: a
client sending a header a minute ("slowloris") held its connection, and its file
descriptor, forever (50 of 50 still open after 100 s here), until the front could
accept nothing, its probes included. Here a connection must begin a request within the
keep-alive time, and finish its headers within `header_timeout_s` of beginning it.

uvicorn writes an answer's headers and its body in two sends; on loopback each send
also runs the receiver's side of TCP, and the headers' send was the front's costliest
line under load (py-spy: 16% of its samples, the body's 4%). Writes made in one turn of
the event loop go out together at its end instead (`_Corked`).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def with_deadlines(header_timeout_s: float, idle_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, closing a connection whose next request has not
    begun within `idle_timeout_s` of opening, or whose headers are not all in within
    `header_timeout_s` of its first byte."""

    class Deadlined(HttpToolsProtocol):
        _late: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(cast("asyncio.Transport", _Corked(transport, self.loop)))
            self._arm(idle_timeout_s)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm(header_timeout_s)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._late = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._late is not None:
                self._late.cancel()
                self._late = None

        def _too_slow(self) -> None:
            self._late = None
            if not self.transport.is_closing():
                self.transport.close()

    return Deadlined


class _Corked:
    """A transport whose writes within one turn of the event loop are sent as one at its
    end (or at once, once a turn has written `_FLUSH_BYTES`); everything else is the
    transport's own."""

    _FLUSH_BYTES = 1 << 16

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport, self._loop = transport, loop
        self._held: list[bytes] = []
        self._size = 0

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append(data)
        self._size += len(data)
        if self._size >= self._FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held.clear()
            self._size = 0
            if not self._transport.is_closing():
                self._transport.write(data)

    def writelines(self, data: list[bytes]) -> None:
        for d in data:
            self.write(d)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
