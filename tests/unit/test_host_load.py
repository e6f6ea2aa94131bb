"""How busy the chip and the host are: the front's /metrics series, the bench's pace
table, `doctor --url`'s arithmetic and verdict, and the engines' batch sizes on a
pipelined target."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from neuronserve.buckets import BucketGrid, engine_batch_sizes
from neuronserve.host_load import NeuronMonitor, cpu_seconds, front_pace, pace


def test_a_pipelined_target_forms_batches_of_several_device_calls():
    from neuronserve.targets import pipeline_depth

    grid = BucketGrid((1, 4, 8), (16,))
    costs = {"b1_s16": 4, "b4_s16": 8, "b8_s16": 12}
    assert engine_batch_sizes(grid, costs) == [8]
    assert engine_batch_sizes(grid, costs, depth=3) == [8, 16, 24]
    assert pipeline_depth("cpu") == 1 and pipeline_depth("neuronx") > 1
    assert pipeline_depth("neuron") == pipeline_depth("neuronx")


def test_the_verdict_names_what_is_saturated():
    assert pace(0.95, 0.30).startswith("the chip")
    assert pace(0.40, 0.95).startswith("the host")
    assert pace(0.40, 0.40).startswith("neither")
    assert pace(None, 0.40).startswith("neither")
    assert "vCPUs" in pace(0.40, 0.95)


def test_the_front_exports_host_cpu_and_each_neuroncores_utilization():
    from neuronserve.serve.front.observe import FrontMetrics

    metrics = FrontMetrics()
    text = generate_latest(metrics.registry).decode()
    own = float(
        next(
            line.split()[-1]
            for line in text.splitlines()
            if line.startswith('neuronserve_host_cpu_seconds_total{role="front"}')
        )
    )
    assert 0 < own <= cpu_seconds()[0] + 0.01  # this process's CPU so far
    assert "neuroncore_utilization" not in text  # no monitor on a CPU host
    metrics.monitor = NeuronMonitor()
    metrics.monitor.history.append((0.0, {0: 42.0, 1: 7.5}))
    metrics.monitor.busy = {0: 3.0, 1: 0.5}
    text = generate_latest(metrics.registry).decode()
    assert 'neuronserve_neuroncore_utilization_percent{neuroncore="0"} 42.0' in text
    assert 'neuronserve_neuroncore_busy_seconds_total{neuroncore="1"} 0.5' in text
    assert "neuronserve_neuroncores_in_use 2.0" in text


def test_doctor_says_when_the_front_cannot_be_read():
    with pytest.raises(OSError, match="cannot read"):
        front_pace("http://127.0.0.1:9", 0.0)


def test_the_bench_report_puts_the_chip_beside_the_host():
    from neuronserve.bench.report import pace_table

    point = {
        "endpoint": "front /embed", "seq": 128, "concurrency": 32, "req_per_s": 1000.0,
        "neuroncore_busy": 0.5, "cpu_ms_per_req_front": 0.9, "cpu_ms_per_req_workers": 0.8,
    }  # fmt: skip
    lines = pace_table({"machine": {"cores": 2}, "points": [point]})
    row = next(line for line in lines if line.startswith("| front /embed"))
    # 1.7 ms x 1000/s over 2 cores: 85% of the host
    assert "| 50% | 85% | 1.70 | the host |" in row
    assert pace_table({"machine": {"cores": 2}, "points": [{"req_per_s": 1.0}]}) == []


def test_tokenizing_without_offsets_gives_the_same_tokens(minilm_dir):
    from neuronserve.tokenization import TextTokenizer

    tok = TextTokenizer(minilm_dir / "tokenizer.json", 16)
    texts = ["Hello there, Ana!", "word " * 40, ("a question?", "its context")]
    for truncate in (False, True):
        fast = tok.encode(texts, truncate, offsets=False)
        full = tok.encode(texts, truncate)
        assert [e.ids for e in fast] == [e.ids for e in full]
        assert [e.full_length for e in fast] == [e.full_length for e in full]
        assert [e.type_ids for e in fast] == [e.type_ids for e in full]
    assert max(len(e.ids) for e in tok.encode(texts, True, offsets=False)) == 16
    # the token-level task keeps its character spans
    assert full[0].source.offsets[1] == (0, 5)
