"""Model-only time of the CPU runtimes neuronserve could use, on one compiled artifact's
model: why int8 is ONNX Runtime's and not torch's dynamic quantisation.

    .venv/bin/python scripts/engines_bench.py MODEL_DIR INT8_ARTIFACT [--threads 1,2]

Batch 1, sequence 8 / 128 / 512, median of repeated calls after warm-up, in one process;
prints a markdown table (ms, and speed-up over eager fp32 measured in the same run).
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings
from pathlib import Path

import numpy as np
import torch

SEQS = (8, 128, 512)


def median_ms(fn, x, m, reps: int) -> float:
    for _ in range(3):
        fn(x, m)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(x, m)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model_dir", type=Path)
    p.add_argument("int8_artifact", type=Path)
    p.add_argument("--threads", default="1,2")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    eager, traced = modules(args.model_dir)
    onnx_bytes = (args.int8_artifact / "model.onnx").read_bytes()
    header(args)
    for threads in [int(t) for t in args.threads.split(",")]:
        from neuronserve.compile.ort import OrtModule

        torch.set_num_threads(threads)
        runtimes = {
            "eager fp32": eager,
            **traced,
            "ONNX Runtime int8 (fused)": OrtModule(onnx_bytes, threads=threads),
        }
        base: dict[int, float] = {}
        for name, fn in runtimes.items():
            cells = []
            for s in SEQS:
                x = torch.randint(1000, 2000, (1, s))
                with torch.inference_mode():
                    ms = median_ms(fn, x, torch.ones_like(x), reps=5 if s == 512 else 15)
                base.setdefault(s, ms)
                cells.append(f"{ms:.1f} ({base[s] / ms:.1f}x)")
            print(f"| {threads} | {name} | " + " | ".join(cells) + " |", flush=True)


def modules(model_dir: Path) -> tuple[torch.nn.Module, dict[str, torch.nn.Module]]:
    """The eager classifier (logits) and its TorchScript traces in fp32, bf16 and torch's
    dynamic int8."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask).logits

    eager = Logits(model).eval()
    ex = (torch.ones(1, 16, dtype=torch.long), torch.ones(1, 16, dtype=torch.long))
    with torch.no_grad():
        ts_fp32 = torch.jit.freeze(torch.jit.trace(eager, ex, check_trace=False))
        ts_bf16 = torch.jit.freeze(
            torch.jit.trace(copy.deepcopy(eager).to(torch.bfloat16), ex, check_trace=False)
        )
        dyn = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(eager), {torch.nn.Linear}, dtype=torch.qint8
        )
        ts_dyn = torch.jit.freeze(torch.jit.trace(dyn, ex, check_trace=False))
    return eager, {
        "TorchScript fp32": ts_fp32,
        "TorchScript bf16": ts_bf16,
        "torch dynamic int8 (TorchScript)": ts_dyn,
    }


def header(args: argparse.Namespace) -> None:
    from datetime import datetime, timezone

    from neuronserve.bench.run import machine

    m = machine()
    print("## CPU runtimes, batch 1, model only\n")
    print(
        f"- date (UTC): {datetime.now(timezone.utc).isoformat(timespec='minutes')}; machine: "
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; torch {m['torch']}"
    )
    print(
        f"- command: `.venv/bin/python scripts/engines_bench.py {args.model_dir} "
        f"{args.int8_artifact}`"
    )
    print(
        "- median ms of repeated calls after warm-up in one process (ratio to eager fp32 "
        "at the same threads)\n"
    )
    print("| threads | runtime | " + " | ".join(f"seq {s} ms (x eager)" for s in SEQS) + " |")
    print("|---:|---|" + "---:|" * len(SEQS))


if __name__ == "__main__":
    main()
