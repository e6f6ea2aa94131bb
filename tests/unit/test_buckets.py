import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuronserve.buckets import Bucket, BucketGrid, pad_batch, padding_ratio, unpad

GRID = BucketGrid((1, 4, 8), (16, 32, 128))


@pytest.mark.parametrize(
    "batch,seq,want",
    [
        (1, 1, Bucket(1, 16)),
        (1, 16, Bucket(1, 16)),
        (1, 17, Bucket(1, 32)),
        (2, 5, Bucket(4, 16)),
        (4, 33, Bucket(4, 128)),
        (5, 128, Bucket(8, 128)),
    ],
)
def test_choose_smallest_bucket_that_holds(batch, seq, want):
    assert GRID.choose(batch, seq) == want


@pytest.mark.parametrize("batch,seq", [(9, 10), (1, 129)])
def test_choose_refuses_what_no_bucket_holds(batch, seq):
    with pytest.raises(ValueError, match="larger than the largest bucket"):
        GRID.choose(batch, seq)


def test_chunks_split_large_batches_and_group_by_length():
    lengths = [100, 3, 50, 4, 120, 5, 6, 7, 8, 9, 10]
    chunks = list(GRID.chunks(lengths))
    assert [len(c) for c in chunks] == [8, 3]
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    # the three longest rows share the last chunk instead of padding every row to 120
    assert sorted(chunks[1]) == [0, 2, 4]


def test_pad_and_unpad_round_trip():
    rows = [
        {"input_ids": [101, 7, 102], "attention_mask": [1, 1, 1]},
        {"input_ids": [101, 102], "attention_mask": [1, 1]},
    ]
    arrays = pad_batch(rows, Bucket(4, 16), ["input_ids", "attention_mask"], {"input_ids": 0})
    assert arrays["input_ids"].shape == (4, 16) and arrays["input_ids"].dtype == np.int64
    assert arrays["input_ids"][0, :4].tolist() == [101, 7, 102, 0]
    assert arrays["attention_mask"].sum() == 5  # padding rows and columns are masked out
    out = np.arange(4 * 3).reshape(4, 3)
    assert unpad(out, 2).tolist() == out[:2].tolist()


def test_pad_refuses_rows_longer_than_bucket():
    with pytest.raises(ValueError, match="17 tokens"):
        pad_batch([{"input_ids": [1] * 17}], Bucket(1, 16), ["input_ids"], {})


def test_padding_ratio():
    assert padding_ratio(16, Bucket(1, 16)) == 0
    assert padding_ratio(8, Bucket(2, 8)) == 1.0


def _cost_of(grid, chunks, lengths, cost):
    return sum(cost(grid.choose(len(c), max(lengths[i] for i in c))) for c in chunks)


def test_measured_costs_split_mixed_lengths_into_the_cheapest_runs():
    grid = BucketGrid((1, 2, 4, 8), (8, 128))
    # times like MiniLM's on a CPU: a long bucket costs about its tokens, plus a call
    ms = {b.key: 1.0 + b.batch * b.seq * 0.05 for b in grid.buckets}
    lengths = [5, 6, 7, 120, 5, 8, 100, 6]
    chunks = list(grid.chunks(lengths, lambda b: ms[b.key]))
    # the six short rows in one short bucket, the two long ones in a small long bucket
    assert sorted(sorted(lengths[i] for i in c) for c in chunks) == [
        [5, 5, 6, 6, 7, 8],
        [100, 120],
    ]
    # without times: the largest batch, padded to the longest row
    assert list(grid.chunks(lengths)) == [sorted(range(8), key=lambda i: lengths[i])]


def test_a_plan_prices_only_the_runs_its_rows_can_make():
    # a lone request weighs one run, not one per batch size of the grid (its cost is
    # looked up on every request the server plans)
    grid = BucketGrid((1, 4, 8, 16, 32), (16, 128))
    priced: list[Bucket] = []

    def cost(b: Bucket) -> float:
        priced.append(b)
        return b.batch * b.seq

    assert list(grid.chunks([20], cost)) == [[0]]
    assert priced == [Bucket(1, 128)]
    priced.clear()
    assert sorted(i for c in grid.chunks([20, 20, 100], cost) for i in c) == [0, 1, 2]
    assert len(priced) == 2 * 3  # two lengths, runs of one to three rows


def test_one_call_beats_several_when_calls_cost_more_than_padding():
    grid = BucketGrid((1, 2, 4, 8), (8, 16))
    ms = {b.key: 10.0 + b.batch * b.seq * 0.001 for b in grid.buckets}  # a call dominates
    lengths = [3, 4, 15, 16, 2, 9]
    assert len(list(grid.chunks(lengths, lambda b: ms[b.key]))) == 1


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 128), min_size=1, max_size=40),
    per_call=st.floats(0.0, 20.0),
    per_token=st.floats(0.001, 1.0),
)
def test_measured_split_holds_every_row_once_and_never_costs_more(lengths, per_call, per_token):
    grid = BucketGrid((1, 2, 4, 8), (16, 32, 64, 128))
    ms = {b.key: per_call + b.batch * b.seq * per_token for b in grid.buckets}

    def cost(b):
        return ms[b.key]

    chunks = list(grid.chunks(lengths, cost))
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    assert all(1 <= len(c) <= grid.max_batch for c in chunks)
    baseline = list(grid.chunks(lengths))
    assert _cost_of(grid, chunks, lengths, cost) <= _cost_of(grid, baseline, lengths, cost) + 1e-9


def test_engine_batches_are_those_that_cut_the_time_per_row():
    from neuronserve.buckets import efficient_batches, engine_batch_sizes

    grid = BucketGrid((1, 4, 8), (16, 128))
    # short rows: batching cuts the time per row (4, 2, 1.5 ms); long rows: it does not
    # (20, 20.5, 21.25 ms), as measured for MiniLM on 2 AVX2 cores
    costs = {"b1_s16": 4, "b4_s16": 8, "b8_s16": 12, "b1_s128": 20, "b4_s128": 82, "b8_s128": 170}
    assert efficient_batches(grid, costs) == {16: 8, 128: 1}
    assert engine_batch_sizes(grid, costs) == [1, 8]
    # batch 4 within 10% of batch 8's time per row: not worth waiting for 8
    assert efficient_batches(grid, {**costs, "b4_s16": 6.4})[16] == 4
    # untimed (a target whose modules run only on the serving host): the whole grid
    assert engine_batch_sizes(grid, {"b1_s16": 4}) == [1, 4, 8]


@given(st.lists(st.floats(0.1, 100.0), min_size=6, max_size=6), st.floats(0.0, 0.5))
def test_an_efficient_batch_is_the_smallest_near_the_least_time_per_row(times, gain):
    from neuronserve.buckets import efficient_batches

    grid = BucketGrid((1, 2, 4), (8, 64))
    costs = {b.key: t for b, t in zip(grid.buckets, times, strict=True)}
    for seq, chosen in efficient_batches(grid, costs, gain).items():
        per_row = {b: costs[Bucket(b, seq).key] / b for b in grid.batch_sizes}
        least = min(per_row.values())
        assert per_row[chosen] <= least * (1 + gain)
        assert all(per_row[b] > least * (1 + gain) for b in grid.batch_sizes if b < chosen)
