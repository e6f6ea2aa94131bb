"""One row of the front's route table (routes.endpoints): what the router, the guard and
the OpenAPI document each read of a route."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .errors import Family

Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class Route:
    path: str
    method: str
    handler: Handler
    family: Family
    summary: str
    tag: str
    # pydantic models of the request body, the 200 answer and the error answers
    body: Any = None
    answer: Any = None
    errors: Any = None
    # probes and documentation: no key needed
    open: bool = False
    # model work: counted against max_in_flight, held to the deadline and body limit
    work: bool = False
    # model management: the admin key outside SageMaker (FrontConfig.admin_keys)
    admin: bool = False
