"""The pad-run-unpad path: token rows -> bucket by length -> pad -> run -> unpad.

The Runner serves with it and `compile` validates and measures accuracy with it, so
what was validated is what is served. Only shapes are known here; decoding requests,
tokenizing and turning outputs into responses belong to the Runner and the tasks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .buckets import Bucket, BucketGrid, pad_batch, padding_ratio, unpad

Row = Mapping[str, Sequence[int]]
Module = Callable[..., torch.Tensor]


@dataclass
class BucketRun:
    """One module call: the bucket it ran in, the real rows and tokens it held, its time."""

    bucket: Bucket
    rows: int
    real_tokens: int
    model_ms: float

    @property
    def padding_ratio(self) -> float:
        return padding_ratio(self.real_tokens, self.bucket)


@dataclass
class RunReport:
    """What one Runner call did, for the servers' metrics."""

    requests: int = 0
    texts: int = 0
    tokenize_ms: float = 0.0
    runs: list[BucketRun] = field(default_factory=list)

    @property
    def model_ms(self) -> float:
        return sum(r.model_ms for r in self.runs)

    @property
    def padding_ratio(self) -> float:
        real = sum(r.real_tokens for r in self.runs)
        total = sum(r.bucket.batch * r.bucket.seq for r in self.runs)
        return (total - real) / max(real, 1)


@dataclass(frozen=True)
class InputLayout:
    """How token rows become the module's tensors: input names in call order and the
    value each pads with."""

    names: tuple[str, ...]
    pad_values: dict[str, int]


@dataclass
class Executor:
    """Runs token rows through the module `module_for` gives for each bucket of `grid`."""

    module_for: Callable[[Bucket], Module]
    grid: BucketGrid
    layout: InputLayout

    def run_bucket(self, rows: Sequence[Row], bucket: Bucket) -> np.ndarray:
        """Pad `rows` to `bucket`, run its module, drop the padding rows."""
        arrays = pad_batch(rows, bucket, self.layout.names, self.layout.pad_values)
        with torch.inference_mode():
            out = self.module_for(bucket)(*(torch.from_numpy(arrays[n]) for n in self.layout.names))
        return unpad(out.float().numpy(), len(rows))

    def run(self, rows: Sequence[Row], report: RunReport | None = None) -> np.ndarray:
        """Outputs for `rows` in their order: rows grouped by length into the smallest
        buckets that hold them, batches beyond the largest bucket split."""
        lengths = [len(r["input_ids"]) for r in rows]
        out: np.ndarray | None = None
        for chunk in self.grid.chunks(lengths):
            bucket = self.grid.choose(len(chunk), max(lengths[i] for i in chunk))
            t0 = time.perf_counter()
            got = self.run_bucket([rows[i] for i in chunk], bucket)
            if out is None:
                out = np.empty((len(rows), *got.shape[1:]), dtype=np.float32)
            out[chunk] = got
            if report is not None:
                report.runs.append(
                    BucketRun(
                        bucket,
                        len(chunk),
                        sum(lengths[i] for i in chunk),
                        (time.perf_counter() - t0) * 1e3,
                    )
                )
        return out if out is not None else np.empty((0, 0), dtype=np.float32)
