"""The workers' wire: frames over a unix stream socket between the front and one
worker, each frame its length, then a small JSON head (orjson) and a binary body.

    frame    = u32 size of the head and body | u32 size of the head | i64 id | head | body
    request  head {"id", "op": "infer", "model", "texts", "parameters", "truncate",
             "direction"}, as the front parsed and checked it (a pair of texts is a list
             of two; "parameters" the task's own); an image task's images are the body,
             "images" their sizes. {"id", "op": "ping"} asks how the worker is.
    answer   head {"id", "status", "error"?, "kind"?, "tokens"?} and a 200's results as
             the task's `finish` gave them (`answer`, `results`): an array's bytes in the
             body ("array": its dtype and shape), several arrays' one after another
             ("arrays"), or JSON in the head ("results"); "tokens": the tokens the model
             read of each text. One copy of each array into the frame, none out of it.
    metrics  head {"id": 0, "op": "metrics", "values": [[name, value, labels], ...]}: what
             a batch adds to the worker's metrics (neuronserve.metrics), after its answers.

The id is in the fixed part, before the head, so that a frame over the reader's bound,
or one whose head does not parse, fails its own request alone: its bytes are read past
and the answer names its id (FrameError.rid). Only a stream that ends inside a frame
closes its connection, and nothing else: the worker's other connections and its
batches go on. The front never sends a frame over the worker's bound (`request_frame`:
that request is answered 413 in the front).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

_SIZES = struct.Struct("<IIq")
# what a request frame may carry (the front's body limit keeps it far below), and an
# answer (the front's answer limit, max_answer_bytes, keeps it below)
MAX_REQUEST_BYTES = 64 << 20
MAX_ANSWER_BYTES = 512 << 20
# how much of a frame over its bound is read at a time, to be passed over
_SKIP = 1 << 20


class FrameError(ValueError):
    """A frame over its bound, or one that does not parse. `rid`: the id of the request
    it carried, when the stream is still whole after it (its request alone fails); None
    when the stream cannot go on (its connection is closed)."""

    def __init__(self, message: str, rid: int | None = None, status: int = 400):
        super().__init__(message)
        self.rid, self.status = rid, status


class FrameTooLarge(ValueError):
    """A frame the worker would refuse: the request's own error, never sent."""


def frame(head: dict[str, Any], body: bytes | memoryview = b"") -> bytes:
    """One frame: its sizes, its id (the head's, 0 without one), its head as JSON, its
    body."""
    raw = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    rid = head.get("id")
    fixed = _SIZES.pack(len(raw) + len(body), len(raw), rid if isinstance(rid, int) else 0)
    return fixed + raw + bytes(body)


def answer(head: dict[str, Any], results: Any) -> bytes:
    """A 200's frame: `head` and one request's results (`results` reads them back)."""
    body: list[Any] = []
    if isinstance(results, np.ndarray) and results.dtype != object:
        head["array"] = _layout(results)
        body.append(np.ascontiguousarray(results).data)
    elif results and isinstance(results, list) and all(isinstance(r, np.ndarray) for r in results):
        head["arrays"] = [_layout(r) for r in results]
        body.extend(np.ascontiguousarray(r).data for r in results)
    else:
        head["results"] = results
    raw = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    size = len(raw) + sum(b.nbytes for b in body)
    return b"".join([_SIZES.pack(size, len(raw), head["id"]), raw, *body])


def results(head: dict[str, Any], body: bytes | memoryview) -> Any:
    """The results an `answer` frame carries: arrays over its body, read-only."""
    if "array" in head:
        return _array(head["array"], body)
    if "arrays" in head:
        out, at = [], 0
        for layout in head["arrays"]:
            array = _array(layout, body[at:])
            out.append(array)
            at += array.nbytes
        return out
    return head.get("results")


def _layout(array: np.ndarray) -> list[Any]:
    return [array.dtype.str, list(array.shape)]


def _array(layout: list[Any], body: bytes | memoryview) -> np.ndarray:
    dtype, shape = np.dtype(layout[0]), [int(d) for d in layout[1]]
    count = math.prod(shape)  # not np.prod: 40x its cost on a short list
    return np.frombuffer(body, dtype=dtype, count=count).reshape(shape)


def request_frame(head: dict[str, Any], body: bytes | memoryview = b"") -> bytes:
    """`frame(head, body)`; FrameTooLarge when it is over what a worker reads."""
    data = frame(head, body)
    if len(data) - _SIZES.size > MAX_REQUEST_BYTES:
        raise FrameTooLarge(
            f"the request makes a frame of {(len(data) - _SIZES.size) / 2**20:.0f} MiB for its "
            f"worker, more than a worker reads ({MAX_REQUEST_BYTES >> 20} MiB; JSON writes a "
            "control character in 6 bytes): send fewer or shorter texts per request"
        )
    return data


async def read_frame(
    reader: asyncio.StreamReader, most: int
) -> tuple[dict[str, Any], memoryview] | None:
    """The next frame's head and body; None at the end of the stream; FrameError for a
    frame larger than `most` bytes or one that does not parse (read past, with its id,
    so that the next frame can be read) or a stream that ends inside a frame."""
    try:
        sizes = await reader.readexactly(_SIZES.size)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise FrameError("the stream ended inside a frame") from None
        return None
    size, head_size, rid = _SIZES.unpack(sizes)
    try:
        if size > most:
            for left in range(size, 0, -_SKIP):
                await reader.readexactly(min(left, _SKIP))
            raise FrameError(f"a frame of {size} bytes, over the bound of {most}", rid, 413)
        data = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameError("the stream ended inside a frame") from None
    if head_size > size:
        raise FrameError("a frame's head is longer than the frame", rid)
    try:
        head = orjson.loads(data[:head_size])
    except orjson.JSONDecodeError as e:
        raise FrameError(f"a frame's head is not JSON: {e}", rid) from None
    if not isinstance(head, dict):
        raise FrameError("a frame's head is not an object", rid)
    return head, memoryview(data)[head_size:]


# a unix socket's address holds at most 107 bytes of path (sun_path)
_SUN_PATH = 107


@contextlib.contextmanager
def reachable(path: Path | str) -> Iterator[str]:
    """The address to bind or connect to for the socket at `path`: the path itself, or,
    when it is too long for a unix socket's address (a deep run folder), the same file
    reached through a descriptor of its folder (/proc/self/fd/N/NAME: the kernel resolves
    it to that folder, whose permissions hold as they do for the path), open while the
    block runs."""
    text = str(path)
    if len(os.fsencode(text)) < _SUN_PATH:
        yield text
        return
    folder = os.open(Path(text).parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{Path(text).name}"
    finally:
        os.close(folder)


def ask(path: str, head: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One question to a worker on its socket, and its answer's head, blocking (the
    supervisor's ping); OSError (or FrameError) when it does not answer in time."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s, reachable(path) as address:
        s.settimeout(timeout_s)
        s.connect(address)
        s.sendall(frame(head))
        sizes = _read(s, _SIZES.size)
        size, head_size, _ = _SIZES.unpack(sizes)
        if size > MAX_REQUEST_BYTES or head_size > size:
            raise FrameError("an answer over its bound")
        data = _read(s, size)
    answer = orjson.loads(data[:head_size])
    if not isinstance(answer, dict):
        raise FrameError("an answer's head is not an object")
    return answer


def _read(s: Any, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = s.recv(n - len(out))
        if not got:
            raise ConnectionError("the worker closed the connection")
        out += got
    return bytes(out)
