"""Error answers in the shape each client family expects: OpenAI's
`{"error": {"message", "type", "param", "code"}}` under /v1/, text-embeddings-inference's
`{"error", "error_type"}` on its routes, and neuronserve's `{"code", "error"}` (what
TorchServe's handler and SageMaker's /invocations answer) everywhere else."""

from __future__ import annotations

from typing import Literal

import orjson
from starlette.responses import Response

Family = Literal["openai", "tei", "native"]

TEI_PATHS = frozenset({"/embed", "/predict", "/rerank", "/tokenize", "/info", "/health"})

_OPENAI = {
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    503: ("server_error", "engine_unavailable"),
    504: ("server_error", "timeout"),
}


def family_of(path: str) -> Family:
    if path.startswith("/v1/"):
        return "openai"
    return "tei" if path in TEI_PATHS else "native"


def error_body(family: Family, status: int, message: str) -> bytes:
    if family == "openai":
        default = ("invalid_request_error", None) if status < 500 else ("server_error", None)
        kind, code = _OPENAI.get(status, default)
        return orjson.dumps(
            {"error": {"message": message, "type": kind, "param": None, "code": code}}
        )
    if family == "tei":
        if status == 429:
            kind = "Overloaded"
        elif status == 503:
            kind = "Unhealthy"
        else:
            kind = "Validation" if status < 500 else "Backend"
        return orjson.dumps({"error": message, "error_type": kind})
    return orjson.dumps({"code": status, "error": message})


def error_response(
    family: Family, status: int, message: str, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        error_body(family, status, message),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )
