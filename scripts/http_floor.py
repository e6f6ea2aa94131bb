"""The floor under a lone request, without our server (scripts/http_floor.sh): an ASGI
app for uvicorn, and the worker process of its two-process mode. FLOOR_MODE:

    bare         every POST answered with the JSON a 768-float embedding makes
    one-process  the body parsed, its text tokenized, a call of the device's time (the
                 Neuron stand-in's hold: 1.00 ms from the call's start) on a thread of its
                 own, its floats written as JSON
    two-process  the same, the text sent over a unix socket to a worker process (run this
                 file: `python scripts/http_floor.py`), which tokenizes it and hands it to
                 its device thread; that thread writes the answer to the socket itself, as
                 our worker's does (FLOOR_VIA_LOOP=1: handed back to the worker's loop to
                 write, one wake-up more)

FLOOR_SOCK: the worker's socket; FLOOR_TOKENIZER: a tokenizer.json.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson
from tokenizers import Tokenizer

MODE = os.environ.get("FLOOR_MODE", "bare")
SOCK = os.environ.get("FLOOR_SOCK", "floor.sock")
VECTOR = np.random.default_rng(0).random(768, dtype=np.float32)
BARE = orjson.dumps([VECTOR], option=orjson.OPT_SERIALIZE_NUMPY)
SIZE = struct.Struct("<I")


# The device's hold is the stand-in's (tests/neuron_standin/_standin_runtime.py, _Core:
# its wake-up measure and hold), written again so that these processes import no torch;
# a change to that hold belongs here too.
def _late() -> float:
    """How late this host's sleep wakes (as the stand-in measures it)."""
    late = []
    for _ in range(15):
        t0 = time.perf_counter()
        time.sleep(0.001)
        late.append(time.perf_counter() - t0 - 0.001)
    return sorted(late)[7]


WAKE_S = _late()
DEVICE = ThreadPoolExecutor(1)


def _device() -> np.ndarray:
    called = time.perf_counter()
    time.sleep(max(0.0, called + 0.001 - WAKE_S - time.perf_counter()))
    return VECTOR


def _tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(os.environ["FLOOR_TOKENIZER"])
    tok.no_padding()
    tok.no_truncation()
    return tok


TOKENIZER = _tokenizer() if MODE != "bare" else None
_link: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global _link
    if scope["type"] != "http":
        return
    chunks, more = [], True
    while more:
        got = await receive()
        chunks.append(got.get("body", b""))
        more = got.get("more_body", False)
    text = orjson.loads(b"".join(chunks))["inputs"]
    if MODE == "bare":
        out = BARE
    elif MODE == "one-process":
        assert TOKENIZER is not None
        TOKENIZER.encode_batch_fast([text])
        vector = await asyncio.wrap_future(DEVICE.submit(_device))
        out = orjson.dumps([vector], option=orjson.OPT_SERIALIZE_NUMPY)
    else:
        if _link is None:
            _link = await asyncio.open_unix_connection(SOCK)
        reader, writer = _link
        head = orjson.dumps({"texts": [text]})
        writer.write(SIZE.pack(len(head)) + head)
        (n,) = SIZE.unpack(await reader.readexactly(SIZE.size))
        vector = np.frombuffer(await reader.readexactly(n), dtype=np.float32)
        out = orjson.dumps([vector], option=orjson.OPT_SERIALIZE_NUMPY)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


async def worker() -> None:
    assert TOKENIZER is not None
    via_loop = bool(os.environ.get("FLOOR_VIA_LOOP"))

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        fd = writer.get_extra_info("socket").fileno()

        def call_and_write() -> None:
            data = _device().tobytes()
            os.write(fd, SIZE.pack(len(data)) + data)

        while True:
            try:
                (n,) = SIZE.unpack(await reader.readexactly(SIZE.size))
            except asyncio.IncompleteReadError:
                return
            TOKENIZER.encode_batch_fast(orjson.loads(await reader.readexactly(n))["texts"])
            if via_loop:
                data = (await asyncio.wrap_future(DEVICE.submit(_device))).tobytes()
                writer.write(SIZE.pack(len(data)) + data)
            else:
                DEVICE.submit(call_and_write)

    await asyncio.start_unix_server(connection, SOCK)
    await asyncio.Event().wait()


if __name__ == "__main__":
    import uvloop

    uvloop.run(worker())
