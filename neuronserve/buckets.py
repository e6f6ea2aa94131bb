"""The shape grid: which (batch, sequence) buckets exist, which one a batch goes to,
how it is padded into it and how outputs are sliced back.

This is the only place that knows about shapes. Static-shape targets compile one
module per bucket; dynamic-shape targets use the grid to bound padding so the
module only ever sees the shapes that were validated and warmed up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, order=True)
class Bucket:
    batch: int
    seq: int

    @property
    def key(self) -> str:
        return f"b{self.batch}_s{self.seq}"


@dataclass(frozen=True)
class BucketGrid:
    batch_sizes: tuple[int, ...]
    sequence_lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_sizes", tuple(sorted(set(self.batch_sizes))))
        object.__setattr__(self, "sequence_lengths", tuple(sorted(set(self.sequence_lengths))))
        if not self.batch_sizes or not self.sequence_lengths:
            raise ValueError("a bucket grid needs at least one batch size and one sequence length")

    @property
    def buckets(self) -> list[Bucket]:
        return [Bucket(b, s) for b in self.batch_sizes for s in self.sequence_lengths]

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    @property
    def max_seq(self) -> int:
        return self.sequence_lengths[-1]

    def choose(self, batch: int, seq: int) -> Bucket:
        """The smallest bucket holding `batch` rows of `seq` tokens."""
        if batch > self.max_batch or seq > self.max_seq:
            raise ValueError(
                f"({batch}, {seq}) is larger than the largest bucket "
                f"({self.max_batch}, {self.max_seq}); split or truncate first"
            )
        b = next(x for x in self.batch_sizes if x >= batch)
        s = next(x for x in self.sequence_lengths if x >= max(seq, 1))
        return Bucket(b, s)

    def chunks(
        self, lengths: Sequence[int], cost: Callable[[Bucket], float] | None = None
    ) -> Iterator[list[int]]:
        """Split row indices into runs that each fit one bucket.

        Rows are grouped by length first, so long and short texts do not share a
        bucket and short ones are not padded to the longest of the whole request.
        Without `cost`, runs are the largest batches in length order. With `cost` (a
        bucket's measured time), the runs are those whose buckets cost least in total:
        six short texts and two long ones go in a short bucket and a small long one,
        not all eight padded to the long length, when that is what the times say.
        """
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        if cost is None:
            for start in range(0, len(order), self.max_batch):
                yield order[start : start + self.max_batch]
            return
        # best[i]: least total cost of the first i rows in length order; runs are
        # contiguous in that order, so the longest row of a run is its last
        best, cut = [0.0] + [float("inf")] * len(order), [0] * (len(order) + 1)
        # a run's cost by its rows (up to what this call has), for each length a run ends
        # at: a batch has few lengths, and this loop runs rows x largest batch times
        run_costs: dict[int, list[float]] = {}
        most = min(self.max_batch, len(order))
        for i in range(1, len(order) + 1):
            longest = lengths[order[i - 1]]
            costs = run_costs.get(longest)
            if costs is None:
                sizes = range(1, most + 1)
                costs = run_costs[longest] = [0.0] + [cost(self.choose(k, longest)) for k in sizes]
            for k in range(1, min(self.max_batch, i) + 1):
                total = best[i - k] + costs[k]
                if total < best[i]:
                    best[i], cut[i] = total, i - k
        runs, i = [], len(order)
        while i > 0:
            runs.append(order[cut[i] : i])
            i = cut[i]
        yield from reversed(runs)


# a larger batch is worth its wait only when it cuts the time per row by more than this
BATCH_GAIN = 0.1


def efficient_batches(
    grid: BucketGrid, bucket_ms: Mapping[str, float], gain: float = BATCH_GAIN
) -> dict[int, int]:
    """For each sequence length, the smallest compiled batch whose measured time per row is
    within `gain` of the least time per row any batch size reaches at that length.

    An engine that hands a worker more requests than this makes them wait for each other
    for almost no saving, and leaves other workers idle meanwhile (TorchServe gives one
    worker whatever queued, up to its batchSize). Empty without times for every bucket."""
    if not all(b.key in bucket_ms for b in grid.buckets):
        return {}
    out = {}
    for seq in grid.sequence_lengths:
        per_row = {b: bucket_ms[Bucket(b, seq).key] / b for b in grid.batch_sizes}
        least = min(per_row.values())
        out[seq] = next(b for b in grid.batch_sizes if per_row[b] <= least * (1 + gain))
    return out


def engine_batch_sizes(
    grid: BucketGrid, bucket_ms: Mapping[str, float], depth: int = 1
) -> list[int]:
    """The batch sizes worth forming at some length (efficient_batches), smallest first:
    Triton's preferred batch sizes, and the largest of them TorchServe's batchSize. The
    whole grid when the buckets were not timed (a target whose modules run only on the
    serving host). `depth`: device calls one engine batch should hold (a worker serves
    such a batch pipelined, its host work beside the device's: Runner.start), so each
    size's multiples up to that many."""
    sizes = sorted(set(efficient_batches(grid, bucket_ms).values())) or list(grid.batch_sizes)
    return sorted({size * k for size in sizes for k in range(1, depth + 1)})


def pad_batch(
    rows: Sequence[Mapping[str, Sequence[int] | np.ndarray]],
    bucket: Bucket,
    input_names: Sequence[str],
    pad_values: dict[str, int],
) -> dict[str, np.ndarray]:
    """Pad token rows into int64 arrays of exactly the bucket's shape (image rows into
    float32 arrays of the bucket's batch).

    Padding rows (when the batch is smaller than the bucket) are all padding with an
    all-zero mask (black images); their outputs are dropped by `unpad`.
    """
    out = {}
    for name in input_names:
        first = rows[0][name] if rows else None
        if isinstance(first, np.ndarray) and first.ndim > 1:
            out[name] = np.zeros((bucket.batch, *first.shape), dtype=np.float32)
            for i, row in enumerate(rows):
                out[name][i] = row[name]
            continue
        arr: np.ndarray = np.full(
            (bucket.batch, bucket.seq), pad_values.get(name, 0), dtype=np.int64
        )
        for i, row in enumerate(rows):
            values = row[name]
            if len(values) > bucket.seq:
                raise ValueError(f"row {i} has {len(values)} tokens, bucket holds {bucket.seq}")
            arr[i, : len(values)] = values
        out[name] = arr
    return out


def unpad(
    output: np.ndarray, n_rows: int, lengths: Sequence[int] | None = None
) -> np.ndarray | list[np.ndarray]:
    """Drop the padding rows a bucket added; with `lengths` (an output per token), also
    each row's padding tokens: one (length, ...) array per row."""
    if lengths is None:
        return output[:n_rows]
    return [output[i, :n] for i, n in enumerate(lengths[:n_rows])]


def padding_ratio(real_tokens: int, bucket: Bucket) -> float:
    """Padded tokens per real token: 0.0 means no waste."""
    total = bucket.batch * bucket.seq
    return (total - real_tokens) / max(real_tokens, 1)
