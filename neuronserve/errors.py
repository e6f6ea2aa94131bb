"""The error a request fails alone with: raised anywhere a request is read, checked or
answered (tasks, images, the front), it becomes that request's
4xx (or a 500 that names no internals) while its batch neighbours are served."""

from __future__ import annotations

import re


class RequestError(ValueError):
    """One request cannot be served; `status` is the HTTP code to answer with."""

    # "[413] message": how a status travels through a protocol with fewer codes (Triton)
    _TAG = re.compile(r"^\[(\d{3})\] (.*)$", re.S)

    def __init__(self, message: str, status: int = 400, kind: str | None = None):
        super().__init__(message)
        self.status = status
        # text-embeddings-inference's error type where the status alone does not tell it
        # ("Empty": nothing was sent; "Tokenizer")
        self.kind = kind

    @property
    def message(self) -> str:
        return str(self)

    def tagged(self) -> str:
        return f"[{self.status}] {self.message}"


def internal_error(doing: str) -> RequestError:
    """A 500 for the client that names no internals: the exception, with its traceback,
    goes to the server's log under an error id the client gets to quote."""
    import logging
    import uuid

    error_id = uuid.uuid4().hex[:12]
    logging.getLogger("neuronserve").exception("error %s while %s", error_id, doing)
    return RequestError(
        f"internal error while {doing} (error id {error_id}; details in the server log)",
        status=500,
    )
