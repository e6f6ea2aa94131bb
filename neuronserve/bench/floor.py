"""The least time this CPU could take for a model: peak matrix-multiply throughput per
precision from a small probe, and an encoder's arithmetic per request from its config.

A model time far above `arithmetic / peak` is overhead an engine could remove (operator
dispatch, memory traffic, unfused attention); one close to it gets faster only with less
arithmetic or a cheaper kind of it (int8 where the CPU multiplies int8 faster).

    python -m neuronserve.bench.floor [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

# tokens x hidden times hidden x hidden: the shape of an encoder's linear layers, large
# enough that the kernel is timed rather than the call into it
PROBE_SHAPE = (256, 1024, 1024)


def peak_gops(threads: int, repeats: int = 7) -> dict[str, float]:
    """Best-of-`repeats` multiply-add throughput on `threads` threads, in GOP/s (a
    multiply-add counts two): fp32 and bf16 through torch.matmul (oneDNN), int8 through
    ONNX Runtime's MatMulInteger (uint8 x int8, the kernel behind its quantised linear
    layers). torch's thread count is put back afterwards."""
    import torch

    m, k, n = PROBE_SHAPE
    ops = 2.0 * m * k * n
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = {}
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
            out[name] = ops / _best_s(lambda a=a, b=b: torch.matmul(a, b), repeats) / 1e9
    finally:
        torch.set_num_threads(before)
    out["int8"] = ops / _best_s(_int8_matmul(threads), repeats) / 1e9
    return {k_: round(v, 1) for k_, v in out.items()}


def _best_s(call: Any, repeats: int) -> float:
    for _ in range(2):
        call()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def _int8_matmul(threads: int) -> Any:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    m, k, n = PROBE_SHAPE
    rng = np.random.default_rng(0)
    weight = rng.integers(-127, 128, size=(k, n), dtype=np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
        "int8_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [m, n])],
        [helper.make_tensor("w", TensorProto.INT8, [k, n], weight.tobytes(), raw=True)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 10)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        onnx.shape_inference.infer_shapes(model).SerializeToString(),
        options,
        providers=["CPUExecutionProvider"],
    )
    feed = {"a": rng.integers(0, 256, size=(m, k), dtype=np.uint8)}
    return lambda: session.run(None, feed)


def encoder_gflop(config: Mapping[str, Any], seq: int, batch: int = 1) -> float:
    """Multiply-add arithmetic (GOP, two per multiply-add) of one pass of a BERT-shaped
    encoder over `batch` rows of `seq` tokens: per layer the four attention projections,
    the two feed-forward matrices, and the attention scores and their weighted sum.
    Embeddings, norms, pooling and heads are left out (a few per cent at most)."""
    hidden = int(config.get("hidden_size") or config["dim"])
    ffn = int(config.get("intermediate_size") or config["hidden_dim"])
    layers = int(config.get("num_hidden_layers") or config["n_layers"])
    per_layer = 2 * seq * (4 * hidden * hidden + 2 * hidden * ffn) + 4 * seq * seq * hidden
    return batch * layers * per_layer / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="threads per probe (default 1)")
    args = p.parse_args()
    print(json.dumps({"threads": args.threads, "gops": peak_gops(args.threads)}))


if __name__ == "__main__":
    main()
