"""The offline reference a server's short-request throughput is held against: the
artifact's own OpenVINO model run in this process by OpenVINO itself, batches of 32
texts of exactly N tokens (tokenized by the artifact's tokenizer, as a user's offline
loop would), no server. Every OpenVINO configuration that could be the best on this
machine is tried (one stream on every core; a stream per core with an asynchronous
queue) and the best texts/s is the reference; the median of `--repeats` timed passes.

    .venv/bin/python scripts/offline_reference.py ARTIFACT --sequence-lengths 8,16,128
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import time
import zipfile
from pathlib import Path

import numpy as np
import openvino as ov
from tokenizers import Tokenizer

from neuronserve.artifact import read_manifest
from neuronserve.bench.texts import text_with_tokens
from neuronserve.compile.openvino import (
    INPUT_ORDER_KEY,
    PRECISION_KEY,
    inference_precision,
    native_bf16,
)

BATCH = 32


def load(artifact: Path) -> tuple[ov.Core, ov.Model, list[str], str]:
    manifest = read_manifest(artifact)
    with zipfile.ZipFile(io.BytesIO((artifact / manifest.modules["dynamic"]).read_bytes())) as z:
        xml, weights = z.read("model.xml"), z.read("model.bin")
    core = ov.Core()
    model = core.read_model(xml, ov.Tensor(np.frombuffer(weights, dtype=np.uint8)))
    names = model.get_rt_info(INPUT_ORDER_KEY).astype(str).split(",")
    hint = inference_precision(model.get_rt_info(PRECISION_KEY).astype(str), native_bf16(core))
    return core, model, names, hint


def feeds(tokenizer: Tokenizer, text: str, names: list[str], taken: set[str]) -> dict:
    enc = tokenizer.encode_batch([text] * BATCH)
    columns = {
        "input_ids": [e.ids for e in enc],
        "attention_mask": [e.attention_mask for e in enc],
        "token_type_ids": [e.type_ids for e in enc],
    }
    return {n: np.asarray(columns[n], dtype=np.int64) for n in names if n in taken}


def texts_per_s(loaded: tuple, streams: int, tok: Tokenizer, text: str, secs: float) -> float:
    """Batches of `text` for `secs` seconds on `streams` OpenVINO streams; texts/s."""
    core, model, names, hint = loaded
    cores = len(os.sched_getaffinity(0))
    compiled = core.compile_model(
        model,
        "CPU",
        {
            "INFERENCE_NUM_THREADS": cores,
            "NUM_STREAMS": streams,
            "PERFORMANCE_HINT": "LATENCY" if streams == 1 else "THROUGHPUT",
            "INFERENCE_PRECISION_HINT": hint,
        },
    )
    taken = {i.get_any_name() for i in compiled.inputs}
    queue = ov.AsyncInferQueue(compiled, streams)
    done = [0]
    queue.set_callback(lambda *_: done.__setitem__(0, done[0] + 1))
    for _ in range(3 * streams):  # warm-up
        queue.start_async(feeds(tok, text, names, taken))
    queue.wait_all()
    done[0] = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        # tokenizing is part of every batch, as in a user's offline loop
        queue.start_async(feeds(tok, text, names, taken))
    queue.wait_all()
    return done[0] * BATCH / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--sequence-lengths", default="8,16,128")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    loaded = load(args.artifact)
    tok = Tokenizer.from_file(str(args.artifact / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    cores = len(os.sched_getaffinity(0))
    out = {"batch": BATCH, "cores": cores, "precision_hint": loaded[3], "openvino": ov.__version__}
    for seq in (int(s) for s in args.sequence_lengths.split(",")):
        text = text_with_tokens(args.artifact / "tokenizer.json", seq)
        by_streams = {}
        for streams in sorted({1, cores}):
            runs = [
                texts_per_s(loaded, streams, tok, text, args.seconds) for _ in range(args.repeats)
            ]
            by_streams[streams] = {"median": statistics.median(runs), "runs": runs}
        best = max(by_streams, key=lambda s: by_streams[s]["median"])
        out[str(seq)] = {
            "best_streams": best,
            "texts_per_s": by_streams[best]["median"],
            "by_streams": by_streams,
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
