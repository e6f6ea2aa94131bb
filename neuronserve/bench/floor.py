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

# tokens x in x out: the linear layers of encoders at a few sizes (MiniLM's feed-forward
# at 128 tokens, DistilBERT's at 256, a square one), large enough that the kernel is timed
# rather than the call into it; the peak is the best of them
PROBE_SHAPES = ((128, 384, 1536), (256, 768, 3072), (512, 1024, 1024))


def peak_gops(
    threads: int,
    repeats: int = 10,
    budget_s: float = 2.0,
    shapes: tuple[tuple[int, int, int], ...] = PROBE_SHAPES,
) -> dict[str, float]:
    """Multiply-add throughput on `threads` threads, in GOP/s (a multiply-add counts two),
    best over the probe shapes of the best of `repeats` calls (fewer once a shape has
    taken `budget_s`: bf16 without AVX512-BF16 runs at a few GOP/s): fp32 and bf16 through
    torch.matmul (oneDNN), int8 through ONNX Runtime's MatMulInteger (uint8 x int8, the
    kernel behind its quantised linear layers). torch's thread count is put back.
    `shapes`: (tokens, in, out) of the multiplications tried."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    out: dict[str, float] = {}
    try:
        for m, k, n in shapes:
            ops = 2.0 * m * k * n
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
                best = _best_s(lambda a=a, b=b: torch.matmul(a, b), repeats, budget_s)
                out[name] = max(out.get(name, 0.0), ops / best / 1e9)
            best = _best_s(_int8_matmul(threads, (m, k, n)), repeats, budget_s)
            out["int8"] = max(out.get("int8", 0.0), ops / best / 1e9)
    finally:
        torch.set_num_threads(before)
    return {name: round(v, 1) for name, v in out.items()}


def _best_s(call: Any, repeats: int, budget_s: float) -> float:
    call()  # warm-up: first-call allocation and kernel selection
    best, spent = float("inf"), 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        took = time.perf_counter() - t0
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return best


def _int8_matmul(threads: int, shape: tuple[int, int, int]) -> Any:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    m, k, n = shape
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
    Embeddings, norms, pooling and heads are left out (a few per cent at most). A ViT's
    `seq` is its image size: it reads one token per patch and a CLS token."""
    if "patch_size" in config:
        seq = (seq // int(config["patch_size"])) ** 2 + 1
    hidden = int(config.get("hidden_size") or config["dim"])
    ffn = int(config.get("intermediate_size") or config["hidden_dim"])
    layers = int(config.get("num_hidden_layers") or config["n_layers"])
    per_layer = 2 * seq * (4 * hidden * hidden + 2 * hidden * ffn) + 4 * seq * seq * hidden
    return batch * layers * per_layer / 1e9


def floor_ms(gop: float, gops: float) -> float:
    """The least time (ms) for `gop` of arithmetic at a peak of `gops` GOP/s."""
    return gop / gops * 1e3


def point_peaks(point: Mapping[str, Any], peaks: Mapping[str, Any] | None) -> dict[str, float]:
    """The probe's peaks (by precision) for the cores one worker of `point` holds: a bench
    run's `peak_gops` is keyed by that core count. Empty when it was not probed."""
    return dict((peaks or {}).get(str(point.get("cores_per_worker")), {}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="threads per probe (default 1)")
    args = p.parse_args()
    print(json.dumps({"threads": args.threads, "gops": peak_gops(args.threads)}))


if __name__ == "__main__":
    main()
