"""OpenVINO for the CPU target: fp32, bf16 and static int8 builds of the same ONNX export.

- fp32 and bf16 are one graph compiled with a different inference precision
  (`INFERENCE_PRECISION_HINT`): bf16 runs matrix products in bfloat16 on a CPU with
  AVX512-BF16 or AMX, and is then also the CPU plugin's default, so fp32 must be asked
  for explicitly or it silently runs bf16 (checked here: the plugin reports bfloat16 as
  its default on this AVX512-BF16 host). CPU device and precision control:
  https://docs.openvino.ai/2024/openvino-workflow/running-inference/inference-devices-and-modes/cpu-device.html
  https://docs.openvino.ai/2024/openvino-workflow/running-inference/optimize-inference/precision-control.html
- int8 is NNCF's post-training quantisation (static: activation ranges calibrated on
  the compile's own calibration texts, weights per channel, SmoothQuant for
  transformers), the rest of the graph in bf16 where the CPU has it:
  https://docs.openvino.ai/2024/openvino-workflow/model-optimization-guide/quantizing-models-post-training/basic-quantization-flow.html

Measured on all-MiniLM-L6-v2 (batch 1, one thread, model only, AVX-512 BF16/VNNI host;
benchmarks/precision-variants-minilm-openvino.md): bf16 1.27 / 8.65 ms at 8 / 128
tokens against TorchScript bf16's 2.68 / 11.34, at a min cosine of 0.99993 to fp32 eager.
No int8 recipe tried there keeps MiniLM's 0.999 on one-word texts, NNCF's static one
included (0.70), so `auto` keeps bf16 for it and int8 for DistilBERT.

The module file is one zip holding the OpenVINO IR (model.xml, model.bin), so an
artifact keeps one file per module. Neither OpenVINO nor NNCF is let report usage to
Intel: models are read with `Core.read_model` (convert_model's front end sends
telemetry) and NNCF is imported with its own switch off (NNCF_CI, nncf/telemetry).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .onnx_export import exported

log = logging.getLogger(__name__)

# rt_info keys: the build's precision and the manifest's input order travel in model.xml
PRECISION_KEY = "neuronserve_precision"
INPUT_ORDER_KEY = "neuronserve_input_order"


def native_bf16(core: Any) -> bool:
    return "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def inference_precision(precision: str, bf16_here: bool) -> str:
    """What a build's precision asks of the CPU plugin here: fp32 asks f32 (the plugin
    would otherwise pick bf16 on a bf16 CPU), bf16 asks bf16, and int8 runs what lies
    between its quantised operators in bf16 where the CPU has it, else f32."""
    if precision == "fp32":
        return "f32"
    return "bf16" if bf16_here or precision == "bf16" else "f32"


def unavailable(precision: str) -> str | None:
    """Why OpenVINO cannot build `precision` on this host, or None."""
    try:
        import openvino as ov
    except ImportError:
        return "OpenVINO is not installed (pip install 'neuronserve[cpu]')"
    if precision == "int8":
        try:
            import nncf  # noqa: F401 - only whether it imports
        except ImportError:
            return "NNCF is not installed (pip install 'neuronserve[cpu]')"
    if precision == "bf16" and not native_bf16(ov.Core()):
        # the plugin would quietly run f32 under a bf16 name
        return "this CPU has no native bf16 (AVX512-BF16 or AMX), so OpenVINO would run f32"
    return None


class OvModule:
    """An OpenVINO compiled model called like the TorchScript modules: tensors in the
    manifest's input order, one float tensor out."""

    file_suffix = ".openvino"

    def __init__(self, file_bytes: bytes, threads: int | None = None):
        import openvino as ov

        self.file_bytes = file_bytes
        with zipfile.ZipFile(io.BytesIO(file_bytes)) as z:
            xml, weights = z.read("model.xml"), z.read("model.bin")
        core = ov.Core()
        model = core.read_model(xml, ov.Tensor(np.frombuffer(weights, dtype=np.uint8)))
        precision = model.get_rt_info(PRECISION_KEY).astype(str)
        self.input_names = model.get_rt_info(INPUT_ORDER_KEY).astype(str).split(",")
        bf16_here = native_bf16(core)
        if precision == "bf16" and not bf16_here:
            log.warning(
                "this CPU has no native bf16: OpenVINO runs this bf16 build as it can here "
                "(f32 or emulated bf16), which compile neither checked nor timed; compile "
                "on a host like this one to get the build that is right for it"
            )
        hint = inference_precision(precision, bf16_here)
        # The worker's core lease sized torch's pool (pin_cpu); the plugin's own threads
        # follow it. One stream: a worker runs one batch at a time.
        self.compiled = core.compile_model(
            model,
            "CPU",
            {
                "INFERENCE_NUM_THREADS": threads or torch.get_num_threads(),
                "NUM_STREAMS": 1,
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_PRECISION_HINT": hint,
            },
        )
        # An infer request's output memory is reused by its next call: one request,
        # one call at a time, and each output copied out.
        self._request = self.compiled.create_infer_request()
        self._output = self.compiled.output(0)
        self._taken = {i.get_any_name() for i in self.compiled.inputs}
        self._lock = threading.Lock()

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        feed = {
            n: np.ascontiguousarray(t.numpy())
            for n, t in zip(self.input_names, tensors, strict=True)
            if n in self._taken
        }
        with self._lock:
            out = self._request.infer(feed)[self._output]
            return torch.from_numpy(np.array(out, dtype=np.float32, copy=True))

    def eval(self) -> OvModule:
        return self


def export_openvino(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    precision: str,
    options: dict[str, Any],
) -> bytes:
    """The module as an OpenVINO IR zip for `precision`: fp32, bf16, or int8 quantised
    with NNCF on `options["calibration"]()`'s inputs (real text, padded as served).
    `options`: the compile's target options (input names, per_token)."""
    import openvino as ov

    names = options["input_names"][: len(example)]
    source, _ = exported(module, example, names, bool(options.get("per_token")))
    with tempfile.TemporaryDirectory(prefix="neuronserve-openvino-") as tmp_name:
        tmp = Path(tmp_name)
        model = ov.Core().read_model(str(source))
        if precision == "int8":
            calibration: Callable[[], Sequence[tuple[torch.Tensor, ...]]] | None = options.get(
                "calibration"
            )
            if calibration is None:
                raise ValueError("int8 through OpenVINO needs calibration inputs")
            model = _quantized(model, names, calibration())
        model.set_rt_info(precision, PRECISION_KEY)
        model.set_rt_info(",".join(names), INPUT_ORDER_KEY)
        # fp32 weights stay fp32: save_model halves them to fp16 unless told not to
        ov.save_model(model, str(tmp / "model.xml"), compress_to_fp16=False)
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
            z.write(tmp / "model.xml", "model.xml")
            z.write(tmp / "model.bin", "model.bin")
        return out.getvalue()


def _quantized(model: Any, names: list[str], batches: Sequence[tuple[torch.Tensor, ...]]) -> Any:
    os.environ.setdefault("NNCF_CI", "1")  # NNCF's only switch for its telemetry
    import nncf

    taken = {i.get_any_name() for i in model.inputs}
    feeds = [
        {n: t.numpy() for n, t in zip(names, batch, strict=False) if n in taken}
        for batch in batches
    ]
    nncf.set_log_level(logging.ERROR)
    # its progress bars go where compile's own progress goes, not into stdout
    with contextlib.redirect_stdout(sys.stderr):
        return nncf.quantize(
            model,
            nncf.Dataset(feeds),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(feeds),
        )
