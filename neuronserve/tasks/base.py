"""What every task shares: request payload decoding and the per-request error type.

A task's stages, in the order the Runner calls them (infinity's encode_pre, encode_core,
encode_post, with the model run between them):

    parse          request payload -> texts (or text pairs) and checked parameters
    check_encoded  each text's token rows (windows, for question answering) -> a 4xx or None
    finish         one request's output rows and token rows -> its results, one per text
                   (computed where the tokens are: in the worker)
    respond        results -> the JSON answer (in the worker, or in the front for Triton)
    tensors        results -> Triton's output tensors; results_from turns the first of
                   them back into results for the front

Anything a user sent that cannot be served raises `RequestError`, which fails that
request alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import RequestError
from ..tokenization import Text

# a module's outputs for a batch, unpadded: per-row outputs stacked (rows, dim), or
# per-token outputs one (tokens, dim) array per row
RowOutputs = np.ndarray | list[np.ndarray]

if TYPE_CHECKING:
    import torch

    from ..tokenization import Encoded


TRUNCATION_DIRECTIONS = ("right", "left")


# the most bytes one float32 takes in a JSON answer: "-1.2345678e-38," (orjson writes
# the fewest digits that read back as the same float32)
FLOAT32_JSON_BYTES = 16


@dataclass(frozen=True)
class RequestLimits:
    """What one request may hold, checked before anything is tokenized so that a huge
    request costs its sender a 413, not the worker its memory and its batch neighbours
    their answers (spec: max_client_batch, max_text_chars, max_json_depth)."""

    texts: int | None = None
    chars: int | None = None
    json_depth: int = 32
    # the largest answer one request may get, as JSON bytes (max_answer_bytes)
    answer_bytes: int | None = None
    # the most characters a request's texts may hold in all, as the workers read them
    # (max_body_bytes): a rerank query is read once per document, so a body within its
    # limit can ask for far more than it holds
    total_chars: int | None = None
    # the most chunks the texts of a request asking for chunking may make
    # (max_chunks_per_request): counted once they are tokenized
    chunks: int | None = None

    def check_chunks(self, chunks: int) -> RequestError | None:
        if self.chunks is None or chunks <= self.chunks:
            return None
        return RequestError(
            f"the request's texts make {chunks} chunks; this server runs at most "
            f"{self.chunks} for one request (max_chunks_per_request): send fewer or shorter "
            "texts per request, or a smaller chunking.overlap",
            status=413,
        )

    def check_answer(self, estimate: int | None, what: str) -> RequestError | None:
        """The 413 for a request whose answer would be about `estimate` bytes (described
        by `what`), over `answer_bytes`; None when it fits or is not estimated."""
        if estimate is None or self.answer_bytes is None or estimate <= self.answer_bytes:
            return None
        return RequestError(
            f"the answer would be about {estimate / 2**20:.0f} MiB ({what}), more than this "
            f"server sends for one request ({self.answer_bytes / 2**20:.0f} MiB, "
            "max_answer_bytes): send fewer or shorter texts per request",
            status=413,
        )

    def check(self, request: TaskRequest) -> RequestError | None:
        if self.texts is not None and len(request.texts) > self.texts:
            return RequestError(
                f"{len(request.texts)} inputs in one request; this server takes at most "
                f"{self.texts} (max_client_batch): send fewer per request",
                status=413,
            )
        if self.chars is not None:
            for i, text in enumerate(request.texts):
                if isinstance(text, bytes):
                    continue  # an image: the body size limit bounds it
                n = max(len(part) for part in ((text,) if isinstance(text, str) else text))
                if n > self.chars:
                    return RequestError(
                        f"input {i} holds {n} characters; this server takes at most "
                        f"{self.chars} per text (max_text_chars)",
                        status=413,
                    )
        return self._check_total(request)

    def _check_total(self, request: TaskRequest) -> RequestError | None:
        if self.total_chars is None:
            return None
        total = sum(
            len(part)
            for text in request.texts
            if not isinstance(text, bytes)
            for part in ((text,) if isinstance(text, str) else text)
        )
        if total <= self.total_chars:
            return None
        return RequestError(
            f"the request's texts hold {total} characters as the model reads them (a query is "
            "read once with each document it is paired with), more than this server reads "
            f"for one request ({self.total_chars}, max_body_bytes): send a shorter query or "
            "fewer documents",
            status=413,
        )


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
    # the tokens the model read of each text (its prompt included; every window of a
    # windowed task): set by the worker that tokenized it, and by the workers' client from
    # the worker's answer, so that the front need not tokenize again to report them
    tokens: list[int] | None = None


def prompted(
    texts: list[Text], prompts: dict[str, str], default: str | None, name: str | None
) -> list[Text]:
    """`texts` with the prompt `name` (else the model's default prompt, if any) put before
    each, as sentence-transformers and text-embeddings-inference do; `prompts`: the
    model's (config_sentence_transformers.json, recorded in its manifest)."""
    chosen = name if name is not None else default
    if chosen is None:
        return texts
    if not isinstance(chosen, str) or chosen not in prompts:
        known = ", ".join(repr(p) for p in sorted(prompts)) or "none"
        raise RequestError(
            f"prompt_name {chosen!r} is not one of this model's prompts ({known})", status=422
        )
    prefix = prompts[chosen]
    if any(not isinstance(t, str) for t in texts):
        raise RequestError("prompt_name cannot be set with text pairs", status=422)
    return [prefix + cast(str, t) for t in texts]


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
    body: Any,
    content_type: str | None = None,
    max_depth: int = 32,
    fields: tuple[str, ...] = (),
) -> tuple[Any, dict[str, Any]]:
    """Turn a request body into (inputs, parameters).

    Accepts a parsed JSON object (servers often decode JSON for us), raw bytes or a
    string holding JSON (`{"inputs": ..., "parameters": {...}}`), or plain text, which
    is one input. `fields`: a task's own top-level fields that may stand in for
    "inputs" (rerank's query and documents); inputs is then the object of them. Bytes
    that are not UTF-8, and JSON that does not parse, are errors: guessing would
    silently serve something other than what was sent.
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
    return _fields(body, fields)


def _fields(body: Any, fields: tuple[str, ...] = ()) -> tuple[Any, dict[str, Any]]:
    """(inputs, parameters) of a decoded JSON request object."""
    if not isinstance(body, dict):
        raise RequestError(
            f'request JSON must be an object like {{"inputs": ...}}, got {type(body).__name__}'
        )
    own = {k: body[k] for k in fields if k in body}
    if "inputs" not in body and not own:
        shape = ", ".join(f'"{f}": ...' for f in fields) or '"inputs": "text"'
        raise RequestError(
            f'request JSON has no "inputs" field: send {{{shape}}}'
            + ("" if fields else ' or {"inputs": ["text", ...]}')
        )
    if "inputs" in body and own:
        raise RequestError(f'send either "inputs" or {sorted(own)}, not both')
    unknown = set(body) - {"inputs", "parameters", *fields}
    if unknown:
        expected = ", ".join(["inputs", *fields, "parameters"])
        raise RequestError(f"unknown request fields {sorted(unknown)}: expected {expected}")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError('"parameters" must be a JSON object')
    return body.get("inputs", own), params


def _check_text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RequestError(f"{where} must be a string, got {type(value).__name__}")
    return value


COMMON_PARAMETERS = frozenset({"truncate", "truncation_direction"})

# The Hugging Face inference toolkit (its SageMaker containers) hands a body's parameters
# to a transformers pipeline, so its users send the tokenizer's names: the same requests
# mean the same here. Padding never changes an answer (each batch is padded to its
# compiled shape and the attention mask keeps the padding out), so it is taken and left.
_TRUNCATING = {True: True, False: False, "longest_first": True, "only_first": True,
               "only_second": True, "do_not_truncate": False}  # fmt: skip
_PADDING = (True, False, "longest", "max_length", "do_not_pad")


def toolkit_parameters(parameters: dict[str, Any], own: frozenset[str]) -> dict[str, Any]:
    """`parameters` with the Hugging Face toolkit's names as this project's: `truncation`
    as `truncate`, `padding` taken, `return_all_scores` as `top_k` (for a task that has
    it: true is every label, false the best)."""
    if not {"truncation", "padding", "return_all_scores"} & set(parameters):
        return parameters
    out = dict(parameters)
    if "truncation" in out:
        value = out.pop("truncation")
        if not isinstance(value, (bool, str)) or value not in _TRUNCATING:
            raise RequestError(
                f'"truncation" must be true, false, "longest_first", "only_first", '
                f'"only_second" or "do_not_truncate", got {value!r}'
            )
        if "truncate" in out and out["truncate"] != _TRUNCATING[value]:
            raise RequestError('"truncation" and "truncate" disagree: send one of them')
        out["truncate"] = _TRUNCATING[value]
    if "padding" in out:
        value = out.pop("padding")
        if not isinstance(value, (bool, str)) or value not in _PADDING:
            raise RequestError(
                f'"padding" must be true, false, "longest", "max_length" or "do_not_pad", '
                f"got {value!r}"
            )
    if "return_all_scores" in out and "top_k" in own:
        value = out.pop("return_all_scores")
        if not isinstance(value, bool):
            raise RequestError(f'"return_all_scores" must be true or false, got {value!r}')
        if "top_k" in out:
            raise RequestError('send "top_k" or "return_all_scores", not both')
        out["top_k"] = None if value else 1
    return out


class Task:
    """Base class of the per-task adapters (feature_extraction, text_classification,
    rerank, token_classification, question_answering, fill_mask)."""

    name: str
    accepts_pairs = False
    parameters: frozenset[str] = frozenset()
    # the module answers per token (unpadded along the sequence too), not per text
    per_token = False
    # a text is split into overlapping windows of the largest bucket (question answering)
    windowed = False
    # top-level request fields that stand in for "inputs" (decode_payload)
    body_fields: tuple[str, ...] = ()
    # a task taking pairs may require them (a rerank's, a question's context); an image
    # task's requests hold encoded images
    pairs_required = False
    images = False
    # a request may name one of the model's prompts (prompt_name), and the model's
    # default prompt applies when it names none (Runner.start)
    takes_prompts = False
    # its answers use each token's character span in the text (Encoded.source's offsets)
    uses_offsets = False

    def decode(
        self, body: Any, content_type: str | None, max_depth: int = 32
    ) -> tuple[Any, dict[str, Any]]:
        """(inputs, parameters) of a request body (decode_payload with this task's fields;
        image tasks take image bodies); the Hugging Face toolkit's parameter names read as
        this project's."""
        inputs, parameters = decode_payload(body, content_type, max_depth, self.body_fields)
        return inputs, toolkit_parameters(parameters, self.parameters)

    def parse(self, inputs: Any, parameters: dict[str, Any]) -> TaskRequest:
        own = self.own_parameters(parameters)
        truncate, direction = truncation_parameters(parameters)
        single = not isinstance(inputs, list)
        items = [inputs] if single else inputs
        if not items:
            raise RequestError('"inputs" is an empty list: send at least one text')
        texts = [self._parse_item(item, f"inputs[{i}]") for i, item in enumerate(items)]
        return TaskRequest(
            texts=texts,
            single=single,
            parameters=own,
            truncate=truncate,
            truncation_direction=direction,
        )

    def own_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """The task's own parameters of a request, checked (`check_parameters`)."""
        own = {k: v for k, v in parameters.items() if k not in COMMON_PARAMETERS}
        unknown = set(own) - self.parameters
        if unknown:
            allowed = sorted(self.parameters | COMMON_PARAMETERS)
            raise RequestError(
                f"unknown parameters {sorted(unknown)} for task {self.name} (allowed: {allowed})"
            )
        name = own.get("prompt_name")
        if name is not None and not isinstance(name, str):
            raise RequestError(f'"prompt_name" must be a prompt\'s name, got {name!r}')
        return self.check_parameters(own)

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
    # the transformers Auto class that loads the model with this task's head
    auto_class = "AutoModel"

    def load_model(self, model_dir: Path) -> torch.nn.Module:
        import transformers

        return getattr(transformers, self.auto_class).from_pretrained(model_dir).eval()

    def wrap(
        self, model: torch.nn.Module, model_dir: Path, options: dict[str, Any]
    ) -> WrappedModel:
        raise NotImplementedError

    # The accuracy figure that gates a precision below fp32 (see compile), and the spec
    # field that holds its floor.
    accuracy_metric = "max_abs_diff"
    accuracy_floor_field: str | None = None

    def accuracy(self, got: RowOutputs, want: RowOutputs) -> dict[str, float]:
        """How close compiled outputs `got` are to fp32 eager outputs `want` (rows of
        texts; a per-token task's token rows, one array per text)."""
        g, w = self.compared(stacked(got)), self.compared(stacked(want))
        return {"max_abs_diff": float(np.max(np.abs(g - w)))}

    def compared(self, outputs: np.ndarray) -> np.ndarray:
        """The part of a module's output compared numerically with eager's at compile
        (all of it, but for fill-mask's token ids)."""
        return outputs

    # serve time
    def check_encoded(
        self, encoded: Sequence[Sequence[Encoded]], request: TaskRequest, info: dict[str, Any]
    ) -> RequestError | None:
        """A 4xx for a request whose tokens cannot be served (fill-mask without a mask),
        before anything runs; `encoded`: each text's token rows."""
        return None

    def answer_bytes(
        self, tokens: Sequence[int], parameters: dict[str, Any], info: dict[str, Any]
    ) -> tuple[int, str] | None:
        """For an answer that grows with each text's tokens (every token's vector): at
        most how many bytes of JSON it takes for texts of `tokens` tokens, and how to say
        what it is; None for the answers max_client_batch bounds well enough."""
        return None

    def finish(
        self,
        outputs: RowOutputs,
        encoded: Sequence[Sequence[Encoded]],
        request: TaskRequest,
        info: dict[str, Any],
    ) -> Any:
        """One request's results, one per text, from its output rows (in the order of
        `encoded`'s rows). Per-row tasks keep the rows as they are."""
        return outputs

    def respond(self, results: Any, request: TaskRequest, info: dict[str, Any]) -> Any:
        """JSON response for one request from its results (`finish`): Python values and
        numpy arrays, written with orjson's numpy support (float32 in its shortest form)."""
        raise NotImplementedError


class JsonResultsTask(Task):
    """A task whose result per text is JSON built in the worker (entities, answers,
    predictions)."""

    def respond(self, results: Any, request: TaskRequest, info: dict[str, Any]) -> Any:
        return results[0] if request.single else list(results)


def stacked(outputs: RowOutputs) -> np.ndarray:
    """Per-token outputs (one array per text) as one (tokens, dim) array; rows as they are."""
    return np.concatenate(outputs) if isinstance(outputs, list) else outputs


def positive_int(parameters: dict[str, Any], name: str, default: int | None) -> int | None:
    """parameters[name] checked to be a positive integer (or absent: `default`)."""
    value = parameters.get(name, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RequestError(f'"{name}" must be a positive integer, got {value!r}')
    return value


def boolean(parameters: dict[str, Any], name: str, default: bool) -> bool:
    value = parameters.get(name, default)
    if not isinstance(value, bool):
        raise RequestError(f'"{name}" must be true or false, got {value!r}')
    return value


def labels_of(config: Any) -> list[str]:
    """The model's labels in id order."""
    return [str(config.id2label[i]) for i in range(config.num_labels)]


def logits_over_labels(module: torch.nn.Module, config: Any, **task_settings: Any) -> WrappedModel:
    """A module answering logits over the model's labels, with what the manifest records
    of it (the labels; `task_settings` for how a task scores them)."""
    return WrappedModel(
        module=module.eval(),
        output_name="logits",
        manifest_fields={
            "labels": labels_of(config),
            "pooling": None,
            "normalize": None,
            "task_settings": task_settings,
        },
    )


@dataclass
class WrappedModel:
    """A module taking plain int64 tensors (in `input_names` order) and returning one
    float tensor, plus what the manifest must record to serve it."""

    module: torch.nn.Module
    output_name: str
    manifest_fields: dict[str, Any]
