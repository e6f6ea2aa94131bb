"""Each task's results as named tensors, for servers that speak tensors (KServe v2: Triton's
own API): what a request carries and what an answer is, and the conversions between a
task's results (`Task.finish`) and those tensors, both ways.

Inputs: TEXT (BYTES, [n, 1]), with TEXT_PAIR for a task that takes pairs, or IMAGE
(encoded images) for an image task. Outputs, one row (or element) per text:

    embeddings        EMBEDDING (float32, [dim]); every token's vector: TOKEN_EMBEDDINGS
                      (bytes: a float32 tokens x dim matrix per text); TOKENS (int32,
                      [1]): the tokens the model read of each text (a text model's)
    classification    LOGITS, SCORES (the task's default function), LABEL (the best)
    rerank            LOGITS, SCORE (the relevance)
    the others        one BYTES element of JSON per text (ENTITIES, ANSWERS, PREDICTIONS,
                      TERMS)

The first output of a task carries what `decode` turns back into its results.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

TOKEN_EMBEDDINGS = "TOKEN_EMBEDDINGS"
TOKENS = "TOKENS"
PAIR_INPUT = "TEXT_PAIR"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name, or "bytes"
    dims: tuple[int, ...]  # per text, without the batch dimension


def bytes_element(value: str | bytes) -> bytes:
    """One element of a BYTES tensor: text as UTF-8, bytes (an encoded image) as they are."""
    return value if isinstance(value, bytes) else value.encode()


def bytes_rows(values: Sequence[str | bytes]) -> np.ndarray:
    """A BYTES tensor of one element per row ([n, 1]) (`bytes_element`)."""
    return np.array([[bytes_element(v)] for v in values], dtype=object)


class TaskTensors:
    """One kind of task's tensors: its outputs, how its results become them, and back."""

    # whether its answers carry TOKENS, each text's token count (OpenAI's usage): the
    # worker counted them while tokenizing, so the front need not tokenize again
    counts_tokens = False

    def outputs(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        raise NotImplementedError

    def encode(self, results: Any, info: dict[str, Any]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def output_for(self, parameters: dict[str, Any]) -> str | None:
        """The output that carries a request's results (None: the first)."""
        return None

    def decode(self, tensor: np.ndarray, info: dict[str, Any]) -> Any:
        """A request's results back from its output tensor (`output_for`)."""
        return tensor


class Embeddings(TaskTensors):
    counts_tokens = True

    def outputs(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        # token embeddings: each text's (tokens x dim) float32 matrix as bytes, one element
        # per text (texts differ in length, a tensor's rows may not)
        return [
            TensorSpec("EMBEDDING", "float32", (output_dim,)),
            TensorSpec(TOKEN_EMBEDDINGS, "bytes", (1,)),
            TensorSpec(TOKENS, "int32", (1,)),
        ]

    def output_for(self, parameters: dict[str, Any]) -> str | None:
        return TOKEN_EMBEDDINGS if parameters.get("token_embeddings") else None

    def encode(self, results: Any, info: dict[str, Any]) -> dict[str, np.ndarray]:
        if isinstance(results, list):
            return {TOKEN_EMBEDDINGS: bytes_rows([r.astype("<f4").tobytes() for r in results])}
        return {"EMBEDDING": results.astype(np.float32)}

    def decode(self, tensor: np.ndarray, info: dict[str, Any]) -> Any:
        if tensor.dtype != object:
            return tensor
        dim = int(info["output_dim"])
        return [np.frombuffer(v, dtype="<f4").reshape(-1, dim) for v in tensor.reshape(-1)]


class Classification(TaskTensors):
    def outputs(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        return [
            TensorSpec("LOGITS", "float32", (output_dim,)),
            TensorSpec("SCORES", "float32", (output_dim,)),
            TensorSpec("LABEL", "bytes", (1,)),
        ]

    def encode(self, results: Any, info: dict[str, Any]) -> dict[str, np.ndarray]:
        from .tasks.text_classification import FUNCTIONS, default_function

        labels = info["labels"]
        best = np.argmax(results, axis=-1)
        function = FUNCTIONS[default_function(labels, bool(info.get("multi_label")))]
        return {
            "LOGITS": results.astype(np.float32),
            "SCORES": function(results).astype(np.float32),
            "LABEL": bytes_rows([labels[i] for i in best]),
        }


class Rerank(TaskTensors):
    def outputs(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        return [
            TensorSpec("LOGITS", "float32", (output_dim,)),
            TensorSpec("SCORE", "float32", (1,)),
        ]

    def encode(self, results: Any, info: dict[str, Any]) -> dict[str, np.ndarray]:
        from .tasks.rerank import relevance

        score = relevance(results, int(info.get("relevance_index", 0)))
        return {
            "LOGITS": np.asarray(results, dtype=np.float32),
            "SCORE": score.astype(np.float32).reshape(-1, 1),
        }


@dataclass(frozen=True)
class JsonResults(TaskTensors):
    """A result per text that is JSON built in the worker (entities, answers,
    predictions, terms): one BYTES element per text."""

    name: str

    def outputs(self, output_dim: int, labels: list[str] | None) -> list[TensorSpec]:
        return [TensorSpec(self.name, "bytes", (1,))]

    def encode(self, results: Any, info: dict[str, Any]) -> dict[str, np.ndarray]:
        return {self.name: bytes_rows([json.dumps(r, ensure_ascii=False) for r in results])}

    def decode(self, tensor: np.ndarray, info: dict[str, Any]) -> Any:
        return [json.loads(v.decode() if isinstance(v, bytes) else v) for v in tensor.reshape(-1)]


_BY_TASK: dict[str, TaskTensors] = {
    "feature-extraction": Embeddings(),
    "image-feature-extraction": Embeddings(),
    "text-classification": Classification(),
    "image-classification": Classification(),
    "rerank": Rerank(),
    "token-classification": JsonResults("ENTITIES"),
    "question-answering": JsonResults("ANSWERS"),
    "fill-mask": JsonResults("PREDICTIONS"),
    "sparse-embedding": JsonResults("TERMS"),
}


def of(task: str) -> TaskTensors:
    """Task `task`'s tensors."""
    return _BY_TASK[task]


def results_tensors(
    task: str, results: Any, info: dict[str, Any], tokens: list[int] | None
) -> dict[str, np.ndarray]:
    """One request's results as `task`'s tensors, with TOKENS when the task answers them
    and the worker counted the request's tokens."""
    codec = of(task)
    arrays = codec.encode(results, info)
    if codec.counts_tokens and tokens is not None:
        arrays[TOKENS] = np.asarray(tokens, dtype=np.int32).reshape(-1, 1)
    return arrays


def token_counts(tensor: np.ndarray | None) -> list[int] | None:
    """The TOKENS tensor of an answer as a count per text (None: the answer had none)."""
    return None if tensor is None else [int(n) for n in tensor.reshape(-1)]


def input_name(task: str) -> str:
    """The tensor a request's texts (or images) travel in."""
    from .tasks import get_task

    return "IMAGE" if get_task(task).images else "TEXT"


def first_output(task: str, output_dim: int, labels: list[str] | None) -> str:
    """The output holding the model's rows (or results): what a client reads."""
    return of(task).outputs(output_dim, labels)[0].name


# How named tensors travel in one HTTP body (a worker's answer of results to the front):
# KServe v2's binary tensor layout, its JSON header first, its length in this header
HEADER_LENGTH = "Inference-Header-Content-Length"
_WIRE_TYPES = {"float32": "FP32", "float64": "FP64", "int64": "INT64", "int32": "INT32"}
# every KServe v2 datatype of numbers, as numpy reads its little-endian bytes
_READ_TYPES = {
    "BOOL": "?",
    "INT8": "i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "UINT8": "u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}


def bytes_elements(values: Sequence[bytes]) -> bytes:
    """A BYTES tensor's data: each element after its 4-byte little-endian length."""
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def pack(arrays: dict[str, np.ndarray]) -> tuple[bytes, int]:
    """`arrays` as one body (numbers as their little-endian bytes, BYTES elements each
    after its 4-byte length) and the length of its JSON header."""
    outputs, data = [], []
    for name, array in arrays.items():
        if array.dtype == object:
            raw = bytes_elements([bytes_element(x) for x in array.reshape(-1)])
            kind = "BYTES"
        else:
            raw = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
            kind = _WIRE_TYPES[array.dtype.name]
        outputs.append(
            {
                "name": name,
                "datatype": kind,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        data.append(raw)
    head = orjson.dumps({"outputs": outputs})
    return head + b"".join(data), len(head)


def unpack(body: bytes, header_length: int | str | None, name: str) -> np.ndarray:
    """The tensor `name` of a body `pack` wrote (or a KServe v2 binary answer)."""
    found = unpack_all(body, header_length, (name,))
    if name not in found:
        raise ValueError(f"the answer holds no tensor {name!r}")
    return found[name]


def unpack_all(
    body: bytes, header_length: int | str | None, names: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """The tensors of a body `pack` wrote or of a KServe v2 answer (an output the server
    answered as JSON too), by name: those of `names` it holds, or all. Numbers in their
    dtype, BYTES as an object array of bytes, in the answer's shape."""
    size = int(header_length) if header_length else len(body)
    header = orjson.loads(body[:size])
    at = size
    found = {}
    for o in header.get("outputs", []):
        shape = [int(d) for d in o["shape"]]
        params = o.get("parameters") or {}
        length = int(params.get("binary_data_size", 0))
        raw = body[at : at + length]
        at += length
        if names is not None and o["name"] not in names:
            continue
        if "binary_data_size" not in params:  # the server answered it as JSON
            kind = object if o["datatype"] == "BYTES" else None
            found[o["name"]] = np.array(o["data"], dtype=kind).reshape(shape)
        elif o["datatype"] == "BYTES":
            found[o["name"]] = _bytes_tensor(raw, math.prod(shape)).reshape(shape)
        else:
            dtype = np.dtype(_READ_TYPES[o["datatype"]])
            found[o["name"]] = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return found


def _bytes_tensor(raw: bytes, count: int) -> np.ndarray:
    out = np.empty(count, dtype=object)
    at = 0
    for i in range(count):
        (size,) = struct.unpack_from("<I", raw, at)
        out[i] = raw[at + 4 : at + 4 + size]
        at += 4 + size
    return out
