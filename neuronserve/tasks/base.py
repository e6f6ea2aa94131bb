"""What every task shares: request payload decoding and the per-request error type.

A task turns one request's decoded payload into texts (or text pairs), and one
request's slice of model outputs into its JSON response. Anything a user sent that
cannot be served raises `RequestError`, which fails that request alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

Text = str | tuple[str, str]


class RequestError(ValueError):
    """One request cannot be served; `status` is the HTTP code to answer with."""

    # "[413] message": how a status travels through a protocol with fewer codes (Triton)
    _TAG = re.compile(r"^\[(\d{3})\] (.*)$", re.S)

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status

    @property
    def message(self) -> str:
        return str(self)

    def tagged(self) -> str:
        return f"[{self.status}] {self.message}"

    @classmethod
    def from_engine(cls, message: str, status: int) -> RequestError:
        """The error an engine answered with `status` and `message`, with the status a
        tag in the message carries, if any."""
        m = cls._TAG.match(message)
        return cls(m.group(2), int(m.group(1))) if m else cls(message, status)


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


TRUNCATION_DIRECTIONS = ("right", "left")


@dataclass(frozen=True)
class RequestLimits:
    """What one request may hold, checked before anything is tokenized so that a huge
    request costs its sender a 413, not the worker its memory and its batch neighbours
    their answers (spec: max_client_batch, max_text_chars, max_json_depth)."""

    texts: int | None = None
    chars: int | None = None
    json_depth: int = 32

    def check(self, request: TaskRequest) -> RequestError | None:
        if self.texts is not None and len(request.texts) > self.texts:
            return RequestError(
                f"{len(request.texts)} inputs in one request; this server takes at most "
                f"{self.texts} (max_client_batch): send fewer per request",
                status=413,
            )
        if self.chars is not None:
            for i, text in enumerate(request.texts):
                n = max(len(part) for part in ((text,) if isinstance(text, str) else text))
                if n > self.chars:
                    return RequestError(
                        f"input {i} holds {n} characters; this server takes at most "
                        f"{self.chars} per text (max_text_chars)",
                        status=413,
                    )
        return None


def json_depth(value: Any, limit: int) -> int:
    """How deep `value` nests (a scalar is 0), counted only as far as `limit` + 1."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            d += 1
            deepest = max(deepest, d)
            if d <= limit:
                stack.extend((x, d) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


@dataclass
class TaskRequest:
    texts: list[Text]
    single: bool  # one text was sent, not a list: answer with one result, not a list
    parameters: dict[str, Any] = field(default_factory=dict)
    # this request's own answer to an over-long text: cut it (from the right or the
    # left) or refuse it; None keeps the deployment's `truncation`
    truncate: bool | None = None
    truncation_direction: str = "right"


def truncation_parameters(parameters: dict[str, Any]) -> tuple[bool | None, str]:
    """(truncate, truncation_direction) from a request's parameters, which every task
    takes (text-embeddings-inference's names): they reach the Runner, which tokenizes."""
    truncate = parameters.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise RequestError(f'"truncate" must be true, false or null, got {truncate!r}')
    direction = parameters.get("truncation_direction", "right")
    if isinstance(direction, str):
        direction = direction.lower()
    if direction not in TRUNCATION_DIRECTIONS:
        raise RequestError(f'"truncation_direction" must be "right" or "left", got {direction!r}')
    return truncate, direction


def decode_payload(
    body: Any, content_type: str | None = None, max_depth: int = 32
) -> tuple[Any, dict[str, Any]]:
    """Turn a request body into (inputs, parameters).

    Accepts a parsed JSON object (servers often decode JSON for us), raw bytes or a
    string holding JSON (`{"inputs": ..., "parameters": {...}}`), or plain text, which
    is one input. Bytes that are not UTF-8, and JSON that does not parse, are errors:
    guessing would silently serve something other than what was sent.
    """
    content_type = (content_type or "").split(";")[0].strip().lower()
    if isinstance(body, (bytes, bytearray)):
        try:
            body = bytes(body).decode("utf-8")
        except UnicodeDecodeError as e:
            raise RequestError(f"request body is not valid UTF-8 text: {e}") from None
    if isinstance(body, str):
        looks_json = body.lstrip()[:1] in ("{", "[")
        if content_type != "application/json" and (not looks_json or content_type == "text/plain"):
            return body, {}
        try:
            body = json.loads(body)
        except json.JSONDecodeError as e:
            raise RequestError(f"request body is not valid JSON: {e}") from None
        except RecursionError:  # this request only: never the batch it came in
            raise RequestError(
                f"request JSON nests deeper than {max_depth} levels (max_json_depth)",
                status=413,
            ) from None
    if json_depth(body, max_depth) > max_depth:
        raise RequestError(
            f"request JSON nests deeper than {max_depth} levels (max_json_depth)", status=413
        )
    if isinstance(body, list):
        return body, {}
    return _fields(body)


def _fields(body: Any) -> tuple[Any, dict[str, Any]]:
    """(inputs, parameters) of a decoded JSON request object."""
    if not isinstance(body, dict):
        raise RequestError(
            f'request JSON must be an object like {{"inputs": ...}}, got {type(body).__name__}'
        )
    if "inputs" not in body:
        raise RequestError(
            'request JSON has no "inputs" field: send {"inputs": "text"} or '
            '{"inputs": ["text", ...]}'
        )
    unknown = set(body) - {"inputs", "parameters"}
    if unknown:
        raise RequestError(f"unknown request fields {sorted(unknown)}: expected inputs, parameters")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError('"parameters" must be a JSON object')
    return body["inputs"], params


def _check_text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RequestError(f"{where} must be a string, got {type(value).__name__}")
    return value


COMMON_PARAMETERS = frozenset({"truncate", "truncation_direction"})


class Task:
    """Base class of the per-task adapters (see feature_extraction, text_classification)."""

    name: str
    accepts_pairs = False
    parameters: frozenset[str] = frozenset()

    def parse(self, inputs: Any, parameters: dict[str, Any]) -> TaskRequest:
        own = {k: v for k, v in parameters.items() if k not in COMMON_PARAMETERS}
        unknown = set(own) - self.parameters
        if unknown:
            allowed = sorted(self.parameters | COMMON_PARAMETERS)
            raise RequestError(
                f"unknown parameters {sorted(unknown)} for task {self.name} (allowed: {allowed})"
            )
        truncate, direction = truncation_parameters(parameters)
        single = not isinstance(inputs, list)
        items = [inputs] if single else inputs
        if not items:
            raise RequestError('"inputs" is an empty list: send at least one text')
        texts = [self._parse_item(item, f"inputs[{i}]") for i, item in enumerate(items)]
        return TaskRequest(
            texts=texts,
            single=single,
            parameters=self.check_parameters(own),
            truncate=truncate,
            truncation_direction=direction,
        )

    def _parse_item(self, item: Any, where: str) -> Text:
        if isinstance(item, dict) and self.accepts_pairs:
            if set(item) != {"text", "text_pair"}:
                raise RequestError(f'{where} must be {{"text": ..., "text_pair": ...}}')
            return (
                _check_text(item["text"], f"{where}.text"),
                _check_text(item["text_pair"], f"{where}.text_pair"),
            )
        pairs = ' or {"text": ..., "text_pair": ...}' if self.accepts_pairs else ""
        if not isinstance(item, str):
            raise RequestError(f"{where} must be a string{pairs}, got {type(item).__name__}")
        return item

    def check_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        return dict(parameters)

    # compile time
    def load_model(self, model_dir: Path) -> torch.nn.Module:
        raise NotImplementedError

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        raise NotImplementedError

    # The accuracy figure that gates a precision below fp32 (see compile), and the spec
    # field that holds its floor.
    accuracy_metric = "max_abs_diff"
    accuracy_floor_field: str | None = None

    def accuracy(self, got: np.ndarray, want: np.ndarray) -> dict[str, float]:
        """How close compiled outputs `got` are to fp32 eager outputs `want` (rows of texts)."""
        return {"max_abs_diff": float(np.max(np.abs(got - want)))}

    # serve time
    def respond(self, outputs: np.ndarray, request: TaskRequest, info: dict[str, Any]) -> Any:
        """JSON response for one request from its rows of model output."""
        raise NotImplementedError

    def output_tensors(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        """Named output tensors (per text) for tensor-based servers such as Triton."""
        raise NotImplementedError

    def tensors(self, outputs: np.ndarray, info: dict[str, Any]) -> dict[str, np.ndarray]:
        """Output tensors for one request's rows, named as in `output_tensors`."""
        raise NotImplementedError


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name, or "bytes"
    dims: tuple[int, ...]  # per text, without the batch dimension


class EncoderModule(torch.nn.Module):
    """Base of the per-task modules that get compiled: plain int64 tensors in, the
    Hugging Face model called with the inputs it takes."""

    def __init__(self, model: torch.nn.Module, input_names: list[str]):
        super().__init__()
        self.model = model
        self.uses_token_types = "token_type_ids" in input_names

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None,
    ):
        kwargs: dict[str, torch.Tensor | None] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
        }
        if self.uses_token_types:
            kwargs["token_type_ids"] = token_type_ids
        return self.model(**kwargs)


@dataclass
class WrappedModel:
    """A module taking plain int64 tensors (in `input_names` order) and returning one
    float tensor, plus what the manifest must record to serve it."""

    module: torch.nn.Module
    output_name: str
    manifest_fields: dict[str, Any]
