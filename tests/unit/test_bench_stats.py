"""The benchmark arithmetic, against values computed another way."""

import statistics

import pytest

from neuronserve.bench.stats import summarize
from neuronserve.bench.texts import text_with_tokens
from neuronserve.tokenization import TextTokenizer


def test_percentiles_match_the_inclusive_definition():
    lat = [12.0, 3.0, 7.5, 100.0, 8.0, 9.0, 11.0, 2.0, 50.0, 4.0]
    s = summarize(lat, wall_s=2.0)
    q = statistics.quantiles(lat, n=100, method="inclusive")
    assert s.p50_ms == pytest.approx(statistics.median(lat))
    assert s.p95_ms == pytest.approx(q[94]) and s.p99_ms == pytest.approx(q[98])
    assert s.max_ms == 100.0 and s.requests == 10
    assert s.throughput == pytest.approx(5.0)  # requests per wall second, not per latency


def test_summarize_refuses_empty_or_zero_wall():
    with pytest.raises(ValueError):
        summarize([], 1.0)
    with pytest.raises(ValueError):
        summarize([1.0], 0.0)


@pytest.mark.parametrize("n", [3, 8, 16, 64, 128, 256])
def test_texts_have_exact_token_counts(tiny_artifact, n):
    path = tiny_artifact / "tokenizer.json"
    text = text_with_tokens(path, n)
    [enc] = TextTokenizer(path, 10_000).encode([text], truncate=False)
    assert len(enc.ids) == n
    assert all(w.isalpha() for w in text.split())
