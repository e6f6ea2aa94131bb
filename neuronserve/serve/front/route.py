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
    # model management: the admin key outside SageMaker (FrontConfig.admin_keys)
    admin: bool = False
    # health probes and the metrics scrape: answered however busy the front is (never
    # 429), so a load balancer or SageMaker does not take a busy front out of rotation
    # and its metrics show the load; every other route counts against max_in_flight
    probe: bool = False
    # loading or unloading a model on every worker: held to the load's own deadline
    # (LOAD_DEADLINE_S) instead of deadline_s, which bounds inference
    loads: bool = False
    # answers from a model (embeddings, scores, ranks): counted in TEI's series too
    infers: bool = False
