"""The front's ASGI application: the route table under Starlette, inside the guard."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .errors import error_response, family_of
from .guard import Guard
from .routes import Api, endpoints, guarded
from .serving import Serving

Lifespan = Callable[[Any], AbstractAsyncContextManager[None]]


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405, in the caller's API shape and naming the routes."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == 404:
        message = f"no route {path}: see /docs for the routes this server answers"
    else:
        message = f"{request.method} is not allowed on {path}"
    return error_response(family_of(path), exc.status_code, message)


def build_app(serving: Serving, lifespan: Lifespan | None = None) -> Guard:
    metrics = serving.metrics
    table = endpoints(Api(serving, metrics), serving.config.metrics_auth)
    app = Starlette(
        # the guard calls handlers itself; these routes answer what it passes on (HEAD)
        routes=[Route(e.path, guarded(e.family, e.handler), methods=[e.method]) for e in table],
        exception_handlers={404: _http_error, 405: _http_error},
        lifespan=lifespan,
    )
    return Guard(app, serving.config, metrics, table)
