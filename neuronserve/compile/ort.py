"""ONNX Runtime (ort) for the CPU target: fp32 with fused transformer operators, and int8.

Measured here (DistilBERT-base, batch 1, one thread, model only; benchmarks/engines.md):
ONNX Runtime dynamic int8 after its transformer optimizer 4.6 / 44 / 219 ms at sequence
8 / 128 / 512, against TorchScript fp32 27 / 148 / 665 ms. all-MiniLM-L6-v2 in fp32
through TorchServe on an AVX2 host (BENCHMARKS.md): the fused graph 5.5 / 49.2 ms per
request at 8 / 128 tokens against TorchScript's 11.7 / 54.9, within 3e-7 of eager: at
short sequences a small model is mostly per-operator overhead, which fusion removes.
Attention is only fused into one operator when the model is exported with eager
attention (onnx_export.py).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .onnx_export import exported

# onnxruntime 1.2x refuses ONNX IR versions above its own maximum
MAX_IR_VERSION = 10


INPUT_ORDER_KEY = "neuronserve_input_order"


class OrtModule:
    """An ONNX Runtime session called like the TorchScript modules: tensors (int64 tokens
    or float pixels) in the manifest's input order, one float tensor out."""

    file_suffix = ".onnx"

    def __init__(self, model_bytes: bytes, threads: int | None = None):
        import onnxruntime as ort

        self.model_bytes = model_bytes
        options = ort.SessionOptions()
        # follow the worker's core lease: pin_cpu sized torch's pool to the cores it holds
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        if options.intra_op_num_threads > 1 and os.environ.get("NEURONSERVE_ORT_SPIN") != "1":
            # Idle pool threads spin by default, burning the CPU that the server's frontend
            # and the other requests' work need on a small host (measured: BENCHMARKS.md).
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            model_bytes, options, providers=["CPUExecutionProvider"]
        )
        # The export drops an input the graph never reads (DeBERTa-v2 without token
        # types): the call still gets every input in the manifest's order, recorded at export
        taken = [i.name for i in self.session.get_inputs()]
        order = self.session.get_modelmeta().custom_metadata_map.get(INPUT_ORDER_KEY)
        self.input_names = order.split(",") if order else taken
        self._taken = set(taken)

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        feed = {
            n: np.ascontiguousarray(t.numpy())
            for n, t in zip(self.input_names, tensors, strict=True)
            if n in self._taken
        }
        return torch.from_numpy(self.session.run(None, feed)[0])

    def eval(self) -> OrtModule:
        return self


def export_onnx(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: list[str],
    int8: bool,
    per_token: bool = False,
) -> bytes:
    """Export to ONNX with eager attention and fuse with ONNX Runtime's transformer
    optimizer; with `int8`, quantise the linear layers' weights to int8 (activations
    dynamically). `per_token`: the output has a sequence axis as well."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    names = input_names[: len(example)]
    source, config = exported(module, example, names, per_token)
    # fp32 and int8 start from one fused graph, kept beside the export it was made of
    fused_path = source.with_name("fused.onnx")
    if not fused_path.is_file():
        fused = optimizer.optimize_model(
            str(source),
            model_type="vit" if config.model_type == "vit" else "bert",
            opt_level=1,
            num_heads=int(config.num_attention_heads),
            hidden_size=int(config.hidden_size),
        )
        fused.save_model_to_file(str(fused_path))
    if not int8:
        return _serialized(onnx.load(str(fused_path)), names)
    with tempfile.TemporaryDirectory(prefix="neuronserve-onnx-") as tmp_name:
        tmp = Path(tmp_name)
        # its advice to run a pre-processing pass is for static (calibrated) quantisation
        logging.disable(logging.WARNING)
        try:
            quantize_dynamic(
                str(fused_path),
                str(tmp / "int8.onnx"),
                weight_type=QuantType.QInt8,
                # the fused operators are in Microsoft's domain, which ONNX shape
                # inference does not type; their outputs are float
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        finally:
            logging.disable(logging.NOTSET)
        return _serialized(onnx.load(str(tmp / "int8.onnx")), names)


def _serialized(model: Any, input_order: list[str]) -> bytes:
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    entry = model.metadata_props.add()
    entry.key, entry.value = INPUT_ORDER_KEY, ",".join(input_order)
    return model.SerializeToString()
