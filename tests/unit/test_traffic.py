"""What a server records for tuning its grid, read back as `neuronserve tune` reads it:
each text's tokens on the front's /metrics (in-process front), each device call's rows in
the workers' series (as the front's client of the workers builds them from what a batch
reports). The full path through real workers: tests/servers/test_front_contract.py."""

from __future__ import annotations

import pytest
from in_process_front import front
from prometheus_client import generate_latest
from transformers import AutoTokenizer

from neuronserve import traffic
from neuronserve.workers.client import _Series


def test_each_texts_tokens_reach_the_front_metrics(tmp_path, tiny_runner, tiny_embedder_dir):
    client, _, _ = front(tmp_path, {"tiny": tiny_runner})
    texts = ["short", "a text of some more words than the first one has", "two words"]
    assert client.post("/embed", json={"inputs": texts}).status_code == 200
    text = client.get("/metrics").text
    lengths = [len(i) for i in AutoTokenizer.from_pretrained(tiny_embedder_dir)(texts)["input_ids"]]
    # nothing from the workers yet: said, not guessed
    with pytest.raises(ValueError, match="neuronserve_batch_rows"):
        traffic.read(text, "tiny")
    rows = _Series()
    runs = [("b4s16", "3"), ("b1s64", "1")]
    rows.add([["bucket_runs", 1, {"model": "tiny", "bucket": b, "batch_size": n}] for b, n in runs])
    seen = traffic.read(text + generate_latest(rows.registry).decode(), "tiny")
    assert seen.tokens.count == 3 and seen.tokens.total == sum(lengths)
    bound = [next(b for b in traffic.TOKEN_BUCKETS if n <= b) for n in lengths]
    assert {b: n for b, n in seen.tokens.by_bound.items() if n} == {
        b: bound.count(b) for b in bound
    }
    assert seen.rows.count == 2 and seen.rows.total == 4
    assert seen.rows.by_bound[3.0] == 1 and seen.rows.by_bound[1.0] == 1
    with pytest.raises(ValueError, match="'other'"):
        traffic.read(text, "other")
