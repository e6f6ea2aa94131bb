"""The pad-run-unpad path: token rows -> bucket by length -> pad -> run -> unpad.

Outputs are per row (an embedding, logits: unpadded along the batch axis) or per token
(a task's `per_token`: each row's tokens cut back to its own length as well).

The Runner serves with it and `compile` validates and measures accuracy with it, so
what was validated is what is served. Only shapes are known here; decoding requests,
tokenizing and turning outputs into responses belong to the Runner and the tasks.
"""

from __future__ import annotations

import functools
import queue
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .buckets import Bucket, BucketGrid, pad_batch, padding_ratio, unpad
from .tasks import get_task
from .tasks.base import RowOutputs

if TYPE_CHECKING:
    from .artifact import Manifest

# a text's token ids per input name, or an image's pixels (pixel_values)
Row = Mapping[str, Sequence[int] | np.ndarray]
Module = Callable[..., torch.Tensor]
# one module call: its output, its time in ms, and when it began (time.time_ns)
Called = tuple[torch.Tensor, float, int]


@dataclass
class BucketRun:
    """One module call: the bucket it ran in, the real rows and tokens it held, its time."""

    bucket: Bucket
    rows: int
    real_tokens: int
    model_ms: float
    # when the call began, in the host's wall clock (a trace's device span)
    start_ns: int = 0

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
    # the host's stages, timed in its wall clock (neuronserve.tracing.Stage): a traced
    # request's worker sends them back with its answer
    stages: list[tuple[str, int, int, dict[str, Any]]] = field(default_factory=list)

    @property
    def model_ms(self) -> float:
        return sum(r.model_ms for r in self.runs)

    @property
    def padding_ratio(self) -> float:
        real = sum(r.real_tokens for r in self.runs)
        total = sum(r.bucket.batch * r.bucket.seq for r in self.runs)
        return (total - real) / max(real, 1)


def token_rows(task: str, token_embeddings: bool) -> tuple[bool, int]:
    """(whether a module of `task` answers per token, how many rows it puts before a
    text's tokens): a token-embeddings module answers its pooled vector, then a vector
    per token."""
    return get_task(task).per_token or token_embeddings, int(token_embeddings)


@dataclass(frozen=True)
class InputLayout:
    """How rows become the module's tensors (input names in call order and the value
    each pads with), and whether the module answers per token. An image model's rows are
    (channels, height, width) pixels: its buckets' "sequence length" is the image height,
    the one size its modules take."""

    names: tuple[str, ...]
    pad_values: dict[str, int]
    per_token: bool = False
    image_shape: tuple[int, int, int] | None = None
    # rows a per-token module answers before a text's tokens (a token-embeddings
    # module's pooled vector)
    leading: int = 0

    @classmethod
    def of(cls, manifest: Manifest) -> InputLayout:
        """How an artifact's modules take their rows and answer (the Runner's, compile's
        and validate's)."""
        per_token, leading = token_rows(manifest.task, manifest.token_embeddings)
        return cls(
            tuple(i.name for i in manifest.inputs),
            {i.name: i.pad_value for i in manifest.inputs},
            per_token=per_token,
            image_shape=manifest.image.shape if manifest.image else None,
            leading=leading,
        )

    def length(self, row: Row) -> int:
        """The row's length along the bucket's sequence axis."""
        return self.image_shape[1] if self.image_shape else len(row["input_ids"])

    def blank_row(self, seq: int) -> Row:
        """A row filling `seq` (warming up a bucket): padding tokens, or a black image."""
        if self.image_shape:
            return {self.names[0]: np.zeros(self.image_shape, dtype=np.float32)}
        pad = self.pad_values.get("input_ids", 0)
        return {"input_ids": [pad] * seq, "attention_mask": [1] * seq, "token_type_ids": [0] * seq}


@dataclass
class Executor:
    """Runs token rows through the module `module_for` gives for each bucket of `grid`.

    `copies` are further copies of every module, one per core of a worker that holds
    several cores where one call runs on one core (Neuron): the chunks of a batch then run
    on them at once, and a batch that fits one bucket is split so every copy gets a part.
    `bucket_ms`: each bucket's measured time (the manifest's); a batch is then split into
    the bucket runs that cost least in total (BucketGrid.chunks).
    """

    module_for: Callable[[Bucket], Module]
    grid: BucketGrid
    layout: InputLayout
    copies: Sequence[Callable[[Bucket], Module]] = ()
    bucket_ms: Mapping[str, float] = field(default_factory=dict)
    _pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    def run_bucket(
        self,
        rows: Sequence[Row],
        bucket: Bucket,
        module_for: Callable[[Bucket], Module] | None = None,
    ) -> RowOutputs:
        """Pad `rows` to `bucket`, run its module, drop the padding (rows, and tokens
        when the module answers per token)."""
        planned = self.plan(rows, [list(range(len(rows)))], [bucket])
        out, _, _ = self._call(planned.tensors[0], bucket, module_for or self.module_for)
        return self._unpad(out, planned, 0)

    def run(self, rows: Sequence[Row], report: RunReport | None = None) -> RowOutputs:
        """Outputs for `rows` in their order: rows grouped by length into the smallest
        buckets that hold them, batches beyond the largest bucket split. The three
        stages in turn; a pipelined caller (Runner.start) runs `call` on a thread of
        its own, so the device waits for no padding or unpadding."""
        planned = self.plan(rows)
        return self.finish(planned, self.call(planned), report)

    def plan(
        self,
        rows: Sequence[Row],
        chunks: list[list[int]] | None = None,
        buckets: list[Bucket] | None = None,
    ) -> Planned:
        """The host's work before the device's: rows grouped into bucket runs (unless
        given) and padded into each bucket's tensors."""
        lengths = [self.layout.length(r) for r in rows]
        if chunks is None:
            chunks = list(self.grid.chunks(lengths, self._cost))
            if self.copies:
                chunks = _spread(chunks, 1 + len(self.copies))
        if buckets is None:
            buckets = [self.grid.choose(len(c), max(lengths[i] for i in c)) for c in chunks]
        names, pads = self.layout.names, self.layout.pad_values
        tensors = []
        for chunk, bucket in zip(chunks, buckets, strict=True):
            arrays = pad_batch([rows[i] for i in chunk], bucket, names, pads)
            tensors.append(tuple(torch.from_numpy(arrays[n]) for n in names))
        return Planned(len(rows), lengths, chunks, buckets, tensors)

    @functools.cached_property
    def _cost(self) -> Callable[[Bucket], float] | None:
        """Each bucket's measured time where the grid's every bucket has one (else None),
        found once: a batch's plan looks it up for every run it weighs."""
        costs = self.bucket_ms
        if not costs or not all(b.key in costs for b in self.grid.buckets):
            return None
        return {b: costs[b.key] for b in self.grid.buckets}.__getitem__

    def call(self, planned: Planned) -> list[Called]:
        """The device's work: each bucket run's module call, its output and time (ms),
        on the module copies at once when this worker holds several cores."""
        runs = list(zip(planned.tensors, planned.buckets, strict=True))
        if not self.copies or len(runs) <= 1:
            return [self._call(t, b, self.module_for) for t, b in runs]
        # each copy runs one chunk at a time: a queue hands them to the pool's threads
        free: queue.SimpleQueue[Callable[[Bucket], Module]] = queue.SimpleQueue()
        for module_for in (self.module_for, *self.copies):
            free.put(module_for)

        def on_a_free_copy(tensors: tuple[torch.Tensor, ...], bucket: Bucket) -> Called:
            module_for = free.get()
            try:
                return self._call(tensors, bucket, module_for)
            finally:
                free.put(module_for)

        if self._pool is None:
            self._pool = ThreadPoolExecutor(1 + len(self.copies), "neuronserve-core")
        return list(self._pool.map(on_a_free_copy, *zip(*runs, strict=True)))

    def finish(
        self,
        planned: Planned,
        called: list[Called],
        report: RunReport | None = None,
    ) -> RowOutputs:
        """The host's work after the device's: padding dropped, outputs in the rows'
        order, each bucket run reported."""
        if report is not None:
            for chunk, bucket, (_, ms, at) in zip(
                planned.chunks, planned.buckets, called, strict=True
            ):
                real = sum(planned.lengths[i] for i in chunk)
                report.runs.append(BucketRun(bucket, len(chunk), real, ms, at))
                report.stages.append(
                    ("device", at, at + int(ms * 1e6),
                     {"bucket": f"{bucket.batch}x{bucket.seq}", "rows": len(chunk)})
                )  # fmt: skip
        outs = [self._unpad(out, planned, k) for k, (out, _, _) in enumerate(called)]
        return self._in_row_order(planned.chunks, outs, planned.rows)

    @staticmethod
    def _call(
        tensors: tuple[torch.Tensor, ...], bucket: Bucket, module_for: Callable[[Bucket], Module]
    ) -> Called:
        module = module_for(bucket)
        at, t0 = time.time_ns(), time.perf_counter()
        with torch.inference_mode():
            out = module(*tensors)
        return out, (time.perf_counter() - t0) * 1e3, at

    def _unpad(self, out: torch.Tensor, planned: Planned, k: int) -> RowOutputs:
        chunk = planned.chunks[k]
        lengths = (
            [planned.lengths[i] + self.layout.leading for i in chunk]
            if self.layout.per_token
            else None
        )
        return unpad(out.float().numpy(), len(chunk), lengths)

    def _in_row_order(self, chunks: list[list[int]], outs: list[RowOutputs], n: int) -> RowOutputs:
        """The chunks' outputs put back in the rows' order."""
        if self.layout.per_token:
            per_row: list[np.ndarray] = [np.empty(0)] * n
            for chunk, got in zip(chunks, outs, strict=True):
                for i, row in zip(chunk, got, strict=True):
                    per_row[i] = row
            return per_row
        if not outs:
            return np.empty((0, 0), dtype=np.float32)
        stacked = np.empty((n, *outs[0][0].shape), dtype=np.float32)
        for chunk, got in zip(chunks, outs, strict=True):
            stacked[chunk] = got
        return stacked


@dataclass
class Planned:
    """A batch made ready for the device (Executor.plan): how many rows, each row's
    length, the rows of each bucket run, its bucket and its padded tensors."""

    rows: int
    lengths: list[int]
    chunks: list[list[int]]
    buckets: list[Bucket]
    tensors: list[tuple[torch.Tensor, ...]]


def _spread(chunks: list[list[int]], copies: int) -> list[list[int]]:
    """Halve the largest chunks until every copy has one (or no chunk can be halved)."""
    chunks = list(chunks)
    while len(chunks) < copies:
        largest = max(range(len(chunks)), key=lambda i: len(chunks[i]))
        c = chunks[largest]
        if len(c) < 2:
            break
        chunks[largest : largest + 1] = [c[: len(c) // 2], c[len(c) // 2 :]]
    return chunks
