import numpy as np
import pytest

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
