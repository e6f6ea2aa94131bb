"""The front's outermost layer, as plain ASGI (Starlette's BaseHTTPMiddleware costs more
per request than this whole layer): every request to every route gets an id, the key
check, a place under the in-flight bound (health probes and the metrics scrape
excepted: they are answered however busy the front is), the body limit and a deadline
(the spec's deadline_s, or the client's X-Request-Timeout in seconds when that is
sooner; loading a model has its own), and is counted in the metrics.

Order matters and is cheapest first: a request without a valid key is refused (401)
before anything is read; one over the in-flight bound (429, Retry-After) before its
body is read; a body over the limit (413) as soon as its Content-Length, or its bytes so
far, say so. The body is read here, whole, and handed to the route, so a limit breach
is answered as a 413 rather than surfacing as an error inside a route.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request
from starlette.routing import Match
from starlette.routing import Route as StarletteRoute

from ...tracing import TRACING
from .config import LOAD_TIMEOUT_S, FrontConfig
from .errors import Family, error_body, family_of
from .observe import FrontMetrics
from .route import Route
from .routes import MODEL, REQUEST_ID, guarded
from .serving import RELEASE

log = logging.getLogger("neuronserve.front")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_GOOD_ID = re.compile(rb"[A-Za-z0-9._-]{1,64}")
# how long loading, swapping or unloading a model may take on every worker: the load's
# own limit, and a margin for its answer to be the load's error rather than a 504
LOAD_DEADLINE_S = LOAD_TIMEOUT_S + 60
# seconds a client told 429 should wait: the workers clear a full front within this at
# any throughput these machines reach
RETRY_AFTER_BUSY = b"1"


class _TooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


class _Call:
    """One request as the guard handles it, and its answer as it is sent: status, whether
    it has started, the request id added to its headers."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, endpoint: Route | None):
        self.scope, self.receive, self._send, self.endpoint = scope, receive, send, endpoint
        self.family: Family = endpoint.family if endpoint is not None else family_of(scope["path"])
        self.headers = dict(scope["headers"])
        request_id = self.headers.get(b"x-request-id", b"")
        self.request_id = (
            request_id if _GOOD_ID.fullmatch(request_id) else os.urandom(8).hex().encode()
        )
        scope[REQUEST_ID] = self.request_id.decode()
        self.status, self.started = 500, False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started, self.status = True, message["status"]
            headers = [*message.get("headers", []), (b"x-request-id", self.request_id)]
            message = {**message, "headers": headers}
        await self._send(message)

    async def reply(self, status: int, text: str, headers: tuple = ()) -> None:
        body = error_body(self.family, status, text)
        await self.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *headers,
                ],
            }
        )
        await self.send({"type": "http.response.body", "body": body})


class Guard:
    """Checks every request, then calls the route's handler directly when the path and
    method match one (Starlette's router, exception and error middleware cost more per
    request than the guard itself); anything else (lifespan, 404, 405, HEAD) goes to
    the Starlette `app` under it."""

    def __init__(
        self, app: ASGIApp, config: FrontConfig, metrics: FrontMetrics, endpoints: list[Route]
    ):
        self.app, self.config, self.metrics = app, config, metrics
        # a route is its path and method: GET and POST /models are two, each with its rules
        self.routes = {(e.path, e.method): e for e in endpoints if "{" not in e.path}
        # routes with a name in their path (/models/{name}): matched after the plain ones
        self.templated = [
            (StarletteRoute(e.path, e.handler, methods=[e.method]), e)
            for e in endpoints
            if "{" in e.path
        ]
        self.handlers = {(e.path, e.method): guarded(e.family, e.handler) for e in endpoints}
        self.in_flight = 0

    async def _dispatch(self, call: _Call, receive: Receive) -> None:
        """The handler of the route the guard matched (its rules are the ones applied);
        what it did not match (404, 405) and HEAD go to Starlette under it."""
        scope, endpoint = call.scope, call.endpoint
        if endpoint is None or endpoint.method != scope["method"]:
            await self.app(scope, receive, call.send)
            return
        handler = self.handlers[(endpoint.path, endpoint.method)]
        response = await handler(Request(scope, receive))
        await response(scope, receive, call.send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        call = _Call(scope, receive, send, self._route(scope))
        try:
            if TRACING.on:
                await self._traced(call)
            else:
                await self._guarded(call)
        except Exception:
            # one request's failure must not reach the server: logged whole, answered short
            log.exception("request %s to %s failed", scope[REQUEST_ID], scope["path"])
            if not call.started:
                await call.reply(500, f"internal error (request id {scope[REQUEST_ID]})")
        finally:
            # the route's template, never the path a client sent: the series' labels are
            # bounded by the route table and the served models
            route = call.endpoint.path if call.endpoint is not None else "unmatched"
            model = scope.get(MODEL, "")
            seconds = time.perf_counter() - started
            self.metrics.observe(route, call.status, seconds, model)
            if call.endpoint is not None and call.endpoint.infers:
                self.metrics.inference(call.status, seconds)
            # counted first, released after: a model version dropped once its last
            # request is released (a DELETE) takes its series with it, none comes back
            release = scope.pop(RELEASE, None)
            if release is not None:
                release(scope)

    async def _traced(self, call: _Call) -> None:
        """`_guarded`, in the request's span (OpenTelemetry's HTTP server conventions)."""
        scope = call.scope
        route = call.endpoint.path if call.endpoint is not None else "unmatched"
        attributes = {
            "http.request.method": scope["method"],
            "http.route": route,
            "url.path": scope["path"],
            "neuronserve.request_id": scope[REQUEST_ID],
        }
        with TRACING.request(f"{scope['method']} {route}", call.headers, attributes) as span:
            try:
                await self._guarded(call)
            finally:
                span.set_attribute("http.response.status_code", call.status)
                if scope.get(MODEL):
                    span.set_attribute("neuronserve.model", scope[MODEL])

    def _route(self, scope: Scope) -> Route | None:
        """The route of this path and method (HEAD: GET's rules; Starlette answers it),
        its path parameters put where Starlette's Request reads them; None for no route.
        A path holding a brace (a template's own text, `/models/%7Bname%7D`) is none."""
        path, method = scope["path"], scope["method"]
        asked = "GET" if method == "HEAD" else method
        found = self.routes.get((path, asked))
        if found is not None:
            return found
        if "{" in path or "}" in path:
            return None
        for route, endpoint in self.templated:  # Starlette's GET routes take HEAD too
            match, child = route.matches(scope)
            if match is Match.FULL:
                scope["path_params"] = child.get("path_params", {})
                return endpoint
        return None

    async def _guarded(self, call: _Call) -> None:
        keys, endpoint = self.config.keys, call.endpoint
        open_route = endpoint is not None and endpoint.open
        if endpoint is not None and endpoint.admin:
            # model management takes the admin key, not an API key
            admin = self.config.admin_keys
            if admin is not None and not admin.accepts(call.headers.get(b"authorization")):
                await call.reply(
                    401,
                    f"missing or wrong admin key: send Authorization: Bearer <key from "
                    f"{admin.where}>",
                    ((b"www-authenticate", b'Bearer realm="neuronserve-admin"'),),
                )
                return
            keys = None
        if (
            keys is not None
            and not open_route
            and not keys.accepts(call.headers.get(b"authorization"))
        ):
            await call.reply(
                401,
                "missing or wrong API key: send Authorization: Bearer <key>",
                ((b"www-authenticate", b'Bearer realm="neuronserve"'),),
            )
            return
        if endpoint is None:  # no route: Starlette's 404 or 405, nothing read
            if "{" in call.scope["path"] or "}" in call.scope["path"]:
                # Starlette's router would take a template's own text for a name
                await call.reply(404, f"no route {call.scope['path']}")
                return
            await self._dispatch(call, call.receive)
            return
        if endpoint.probe:
            await self._with_deadline(call, self.config.deadline_s)
            return
        if self.in_flight >= self.config.max_in_flight:
            await call.reply(
                429,
                f"the server is at its limit of {self.config.max_in_flight} requests in "
                "flight (max_in_flight): retry shortly",
                ((b"retry-after", RETRY_AFTER_BUSY),),
            )
            return
        self.in_flight += 1
        self.metrics.in_flight.inc()
        self.metrics.te_queue.inc()
        try:
            await self._with_deadline(
                call, LOAD_DEADLINE_S if endpoint.loads else self.config.deadline_s
            )
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()
            self.metrics.te_queue.dec()

    async def _with_deadline(self, call: _Call, server_s: float) -> None:
        limit = self.config.max_body_bytes
        too_large = (
            f"request body over {limit} bytes (max_body_bytes): send fewer or shorter inputs"
        )
        length = call.headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await call.reply(413, too_large)
            return
        deadline = _deadline(call, server_s)
        if deadline is None:
            await call.reply(
                400, "X-Request-Timeout must be a positive number of seconds, e.g. 2.5"
            )
            return
        task = asyncio.current_task()
        assert task is not None
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = asyncio.get_running_loop().call_later(deadline, expire)
        try:
            with TRACING.span("read"):
                body = await _read_body(call.receive, limit)
            await self._dispatch(call, _replay(body, call.receive))
        except _TooLarge:
            await call.reply(413, too_large)
        except _ClientGone:
            call.status = 499  # nginx's code for it: counted, never sent
        except asyncio.CancelledError:
            if not expired:
                raise
            if sys.version_info >= (3, 11):
                task.uncancel()
            if not call.started:
                why = "X-Request-Timeout" if deadline < server_s else "deadline_s"
                await call.reply(504, f"no answer within {deadline:g} s ({why})")
        finally:
            timer.cancel()


def _deadline(call: _Call, server_s: float) -> float | None:
    """The client's X-Request-Timeout when sooner than the server's deadline (never
    later); None when the header is not a positive number of seconds."""
    asked = call.headers.get(b"x-request-timeout")
    if asked is None:
        return server_s
    try:
        seconds = float(asked)
    except ValueError:
        return None
    return min(server_s, seconds) if 0 < seconds < float("inf") else None


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the disconnect, when it comes

    return replay
