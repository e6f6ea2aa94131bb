"""The front's OpenAPI document, generated from the route table and its pydantic bodies
(pydantic writes every schema; this only places them), and the page that shows it.

The routes are plain Starlette rather than FastAPI because FastAPI's per-request
machinery cost about 100 us of CPU per request here (FastAPI 0.165 against Starlette
1.10, the same proxy route): 15% of the front's whole budget at TorchServe's 8-token
throughput on two cores.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

from pydantic.json_schema import models_json_schema

from ... import __version__
from .route import Route

JSON = "application/json"

SWAGGER_PAGE = """<!doctype html>
<html><head><title>neuronserve API</title><meta charset="utf-8">
<link rel="stylesheet" href="docs/swagger-ui.css">
</head><body><div id="ui"></div>
<script src="docs/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "openapi.json", dom_id: "#ui"});</script>
</body></html>
"""
# The page's files, from the swagger-ui-py package, served by the front itself: the page
# where users paste their keys runs no script fetched from a CDN at view time
SWAGGER_FILES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css"}


@functools.cache
def swagger_file(name: str) -> bytes | None:
    """One of SWAGGER_FILES' bytes (None for any other name)."""
    if name not in SWAGGER_FILES:
        return None
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        return None
    return (Path(next(iter(spec.submodule_search_locations))) / "static" / name).read_bytes()


def document(endpoints: list[Route], keys_on: bool = True) -> dict[str, Any]:
    refs, schemas = _schemas(endpoints)
    paths: dict[str, dict[str, Any]] = {}
    for e in endpoints:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e, refs, keys_on)
    return {
        "openapi": "3.1.0",
        "info": {"title": "neuronserve", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _schemas(endpoints: list[Route]) -> tuple[dict[Any, Any], dict[str, Any]]:
    """(reference to each (model, mode), every schema by name), written by pydantic."""
    wanted: list[tuple[Any, Any]] = []
    for e in endpoints:
        if e.body is not None:
            wanted.append((e.body, "validation"))
        wanted += [(m, "serialization") for m in (e.answer, e.errors) if m is not None]
    refs, defs = models_json_schema(
        list(dict.fromkeys(wanted)), ref_template="#/components/schemas/{model}"
    )
    return refs, defs.get("$defs", {})


def _operation(e: Route, refs: dict[Any, Any], keys_on: bool) -> dict[str, Any]:
    def content(model: Any, mode: str) -> dict[str, Any]:
        return {JSON: {"schema": refs[(model, mode)]}}

    op: dict[str, Any] = {
        "summary": e.summary,
        "tags": [e.tag],
        "operationId": e.path.strip("/").replace("/", "_").replace(".", "_"),
        "responses": {"200": {"description": "OK"}},
    }
    if e.body is not None:
        op["requestBody"] = {"required": True, "content": content(e.body, "validation")}
    if e.answer is not None:
        op["responses"]["200"]["content"] = content(e.answer, "serialization")
    if e.errors is not None:
        op["responses"]["default"] = {
            "description": "an error, in this API's own shape",
            "content": content(e.errors, "serialization"),
        }
    if keys_on and not e.open:
        op["security"] = [{"bearer": []}]
    return op
