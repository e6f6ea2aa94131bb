"""The front's HTTP protocol: uvicorn's httptools protocol with deadlines for what a
client has not sent yet.

uvicorn closes a connection that idles between requests (`timeout_keep_alive`) but not
one that was opened and never sent a byte, nor one whose request headers never end: a
client sending a header a minute ("slowloris") held its connection, and its file
descriptor, forever (50 of 50 still open after 100 s here), until the front could
accept nothing, its probes included. Here a connection must begin a request within the
keep-alive time, and finish its headers within `header_timeout_s` of beginning it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def with_deadlines(header_timeout_s: float, idle_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, closing a connection whose next request has not
    begun within `idle_timeout_s` of opening, or whose headers are not all in within
    `header_timeout_s` of its first byte."""

    class Deadlined(HttpToolsProtocol):
        _late: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
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
