"""How soak speaks to a server (SoakProtocol): the native protocol of the front's
/invocations (and of TorchServe's handler)."""

from __future__ import annotations

import json
from typing import Any


class SoakProtocol:
    """How soak speaks to a server: the body of a request for texts, bodies every server
    must refuse with a 4xx, and the task's JSON answer from a served body. This one is
    the native protocol (`{"inputs", "parameters"}` JSON and the task's JSON answer:
    TorchServe's /predictions, the front's and SageMaker's /invocations)."""

    name = "native"

    def body(self, texts: list[str]) -> bytes:
        return json.dumps({"inputs": texts}).encode()

    def malformed_bodies(self, max_text_chars: int) -> list[bytes]:
        return [
            b"{not json",
            b"\xff\xfe\x00 not utf-8",
            b"[1, 2",
            b"",
            b'{"inputs": 5}',
            b'{"inputs": []}',
            b'{"inputs": [1, 2]}',
            b'{"inputs": {"a": "b"}}',
            b'{"inputs": "x", "parameters": {"truncate": "yes"}}',
            json.dumps({"inputs": "y" * (max_text_chars + 1)}).encode(),
            b'{"inputs": ' + b"[" * 200 + b"]" * 200 + b"}",
        ]

    def served(self, data: bytes, texts: list[str], runner: Any) -> Any:
        """The task's JSON answer in a served body (`runner`: the model's, to build it
        where the protocol carries the model's rows)."""
        return json.loads(data)


NATIVE = SoakProtocol()
