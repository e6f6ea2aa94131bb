"""A bucket grid fitted to traffic (`neuronserve tune`): the sequence lengths that
minimise the expected device time per request for the lengths a server saw (or a file
of texts), within a budget of buckets and a largest length, priced by the artifact's
measured bucket times.

Every text runs in the smallest compiled length that holds it, so its cost is that
length's: the grid decides how much of the device's time is padding. The batch sizes
stay the artifact's (the traffic's batch sizes formed price each length: a call of r
rows runs in the smallest batch bucket holding them, and each of its rows costs that
bucket's time over r). A length without a measured time is estimated from the measured
ones of the same batch (linear between them, or through the nearest two beyond them;
in proportion to the length where only one is measured), and said to be estimated.
The choice is a small dynamic programme over the histogram's bounds that hold some text:
which k of them to compile, the largest always included, so nothing served before is
refused after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .traffic import TOKEN_BUCKETS


@dataclass(frozen=True)
class Lengths:
    """Texts by length (each at the bound of its histogram bucket, or exact from a file)
    and the rows of the device calls they ran in; `texts_per_request`: how many texts a
    request held, on average."""

    counts: Mapping[int, int]
    tokens: float  # their real tokens in all (the histogram's sum)
    rows: Mapping[int, int]
    texts_per_request: float = 1.0


@dataclass(frozen=True)
class Priced:
    """A grid's sequence lengths priced for some traffic."""

    sequence_lengths: tuple[int, ...]
    ms_per_text: float
    padded_share: float
    estimated: tuple[int, ...]  # lengths whose time was estimated, not measured

    def ms_per_request(self, lengths: Lengths) -> float:
        return self.ms_per_text * lengths.texts_per_request


class Costs:
    """ms of a full bucket, measured (the artifact's bucket_ms) or estimated."""

    def __init__(self, bucket_ms: Mapping[str, float], batch_sizes: Sequence[int]):
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.measured: dict[int, dict[int, float]] = {}
        for key, ms in bucket_ms.items():
            b, _, s = key.partition("_")
            if b.startswith("b") and s.startswith("s") and ms > 0:
                self.measured.setdefault(int(b[1:]), {})[int(s[1:])] = float(ms)

    def ms(self, batch: int, seq: int) -> tuple[float, bool]:
        """(ms of bucket (batch, seq), whether it was estimated)."""
        known = self.measured.get(batch) or {}
        if seq in known:
            return known[seq], False
        if not known:  # nothing measured at this batch: in proportion to its tokens
            return batch * seq / 1000.0, True
        points = sorted(known.items())
        below = [p for p in points if p[0] < seq]
        above = [p for p in points if p[0] > seq]
        if not below or len(points) == 1:  # under every measured length: in proportion
            s0, m0 = above[0] if above else points[-1]
            return m0 * seq / s0, True
        (s0, m0), (s1, m1) = (below[-1], above[0]) if above else (below[-2], below[-1])
        return max(m0 * seq / s1, m0 + (m1 - m0) * (seq - s0) / (s1 - s0)), True

    def per_row(self, seq: int, rows: Mapping[int, int]) -> tuple[float, bool]:
        """ms one row of `seq` costs, over the calls' rows as the traffic formed them."""
        total = sum(rows.values()) or 1
        cost, estimated = 0.0, False
        for r, n in (rows or {1: 1}).items():
            r = min(max(1, r), self.batch_sizes[-1])
            batch = next(b for b in self.batch_sizes if b >= r)
            ms, guessed = self.ms(batch, seq)
            cost += n / total * ms / r
            estimated = estimated or guessed
        return cost, estimated


def price(grid: Sequence[int], lengths: Lengths, costs: Costs) -> Priced:
    """What `grid` (sequence lengths) costs this traffic: device ms per text, and the
    share of the tokens run that are padding. A text over the largest length runs at
    the largest (cut, or in chunks of it)."""
    seqs = sorted(grid)
    count = sum(lengths.counts.values()) or 1
    ms, run, estimated = 0.0, 0.0, set()
    for length, n in lengths.counts.items():
        seq = next((s for s in seqs if s >= length), seqs[-1])
        cost, guessed = costs.per_row(seq, lengths.rows)
        ms += n * cost
        run += n * seq
        if guessed:
            estimated.add(seq)
    padded = max(0.0, 1.0 - lengths.tokens / run) if run else 0.0
    return Priced(tuple(seqs), ms / count, padded, tuple(sorted(estimated)))


def propose(lengths: Lengths, costs: Costs, most: int, largest: int) -> Priced:
    """The `most` sequence lengths (at most `largest`, which is always one of them) that
    minimise the expected device time per text."""
    if most < 1:
        raise ValueError("the budget allows no sequence length: raise --buckets")
    # the histogram's bounds that hold some text (multiples of 8: shapes a compiler
    # takes well), and the largest
    seen = {min(length, largest) for length in lengths.counts}
    candidates = sorted({*(b for b in _bounds(seen) if b < largest), largest})
    mass = {c: 0 for c in candidates}
    for length, n in lengths.counts.items():
        mass[next(c for c in candidates if c >= min(length, largest))] += n
    per_row = {c: costs.per_row(c, lengths.rows)[0] for c in candidates}

    def cover(lo: int, hi: int) -> float:  # texts of candidates (lo, hi] run at hi
        return sum(mass[c] for c in candidates if lo < c <= hi) * per_row[hi]

    # best[(j, k)]: least cost of the texts up to candidates[j], with k lengths, the
    # last candidates[j]; and the one before it
    best: dict[tuple[int, int], tuple[float, int | None]] = {}
    for j, c in enumerate(candidates):
        best[(j, 1)] = (cover(0, c), None)
        for k in range(2, most + 1):
            options = [(best[(i, k - 1)][0] + cover(candidates[i], c), i)
                       for i in range(j) if (i, k - 1) in best]  # fmt: skip
            if options:
                best[(j, k)] = min(options)
    last = len(candidates) - 1
    k = min((k for k in range(1, most + 1) if (last, k) in best), key=lambda k: best[(last, k)][0])
    chosen: list[int] = []
    at: int | None = last
    while at is not None:
        chosen.append(candidates[at])
        at, k = best[(at, k)][1], k - 1
    return price(chosen, lengths, costs)


def _bounds(seen: set[int]) -> set[int]:
    """The histogram bounds that hold some text."""
    return {next((b for b in TOKEN_BUCKETS if b >= s), s) for s in seen}
