"""Error answers in the shape each client family expects: OpenAI's
`{"error": {"message", "type", "param", "code"}}` under /v1/, text-embeddings-inference's
`{"error", "error_type"}` on its routes, Cohere's and Jina's `{"message"}` and
`{"detail"}` on their rerank routes, and neuronserve's `{"code", "error"}` (what
TorchServe's handler and SageMaker's /invocations answer) everywhere else."""

from __future__ import annotations

from typing import Literal

import orjson
from starlette.responses import Response

Family = Literal["openai", "tei", "native", "rerank"]

TEI_PATHS = frozenset(
    {
        "/embed",
        "/embed_all",
        "/embed_sparse",
        "/similarity",
        "/predict",
        "/rerank",
        "/tokenize",
        "/decode",
        "/info",
        "/health",
    }
)

_OPENAI = {
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    503: ("server_error", "workers_unavailable"),
    504: ("server_error", "timeout"),
}


def family_of(path: str) -> Family:
    if path.startswith("/v1/"):
        return "openai"
    return "tei" if path in TEI_PATHS else "native"


# a body that is not JSON at all: text-embeddings-inference's routes answer it 400, as
# axum's JSON extractor does (a body of the wrong shape: 422)
SYNTAX = "syntax"
# text-embeddings-inference's error types and the status each answers with (its
# router/src/http/server.rs, `impl From<&ErrorType> for StatusCode`)
TEI_STATUS = {
    "Unhealthy": 503,
    "Backend": 424,
    "Overloaded": 429,
    "Tokenizer": 422,
    "Validation": 422,
    "Empty": 400,
}


def tei_error(status: int, kind: str | None = None) -> tuple[int, str]:
    """(status, TEI error type) of a request refused with `status` (and `kind`, the error
    type where the status does not tell it) on a route of TEI's API. TEI answers a request
    it cannot take, a batch too large among them, 422 (its document says 413 for the
    latter; its code answers 422); an inference that failed, or a route the model does not
    serve, 424. 404 (no such model) and the guard's answers keep their status."""
    if kind in TEI_STATUS:
        return TEI_STATUS[kind], kind
    if kind == SYNTAX:
        return 400, "Validation"
    if status in (400, 413):
        status = 422
    elif status == 500:
        status = 424
    return status, _tei_type(status)


def _tei_type(status: int) -> str:
    """The TEI error type of an answer whose status is already TEI's."""
    return {400: "Validation", 424: "Backend", 429: "Overloaded", 503: "Unhealthy"}.get(
        status, "Validation" if status < 500 else "Backend"
    )


def error_body(family: Family, status: int, message: str, error_type: str | None = None) -> bytes:
    error_type = error_type or _tei_type(status)
    if family == "openai":
        default = ("invalid_request_error", None) if status < 500 else ("server_error", None)
        kind, code = _OPENAI.get(status, default)
        # OpenAI's error object, which its clients read, and text-embeddings-inference's
        # OpenAICompatErrorResponse fields beside it, which TEI's document names
        return orjson.dumps(
            {
                "error": {"message": message, "type": kind, "param": None, "code": code},
                "message": message,
                "code": status,
                "error_type": error_type,
            }
        )
    if family == "tei":
        return orjson.dumps({"error": message, "error_type": error_type})
    if family == "rerank":  # Cohere's clients read `message`, Jina's `detail`
        return orjson.dumps({"message": message, "detail": message})
    return orjson.dumps({"code": status, "error": message})


def error_response(
    family: Family,
    status: int,
    message: str,
    headers: dict[str, str] | None = None,
    kind: str | None = None,
) -> Response:
    """The answer to a request a route refused: on the routes of TEI's API (its own and
    OpenAI's embeddings) with the status and error type TEI answers (`tei_error`)."""
    error_type = None
    if family in ("openai", "tei"):
        status, error_type = tei_error(status, kind)
    return Response(
        error_body(family, status, message, error_type),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )
