"""`neuronserve bench`: the arithmetic of its reports and its load generator's counting
(servers/test_bench_servers.py runs it against real servers). No test asserts a time."""

from __future__ import annotations

import threading

import pytest

from neuronserve.bench import wrk
from neuronserve.bench.endpoints import Endpoint, RequestFailed
from neuronserve.bench.load import Window, run_load
from neuronserve.bench.report import best_by_seq
from neuronserve.bench.run import _add_ratios, parse_endpoint, time_split

PNG = b"\x89PNG\r\n\x1a\n"


def test_time_split_divides_window_deltas_by_requests():
    start = {
        "cpu": {"workers": 10.0, "frontend": 2.0},
        "metrics": {
            "ts_inference_requests_total": 100,
            "ts_queue_latency_microseconds": 5e5,
            "ts_inference_latency_microseconds": 2e6,
            "NeuronServeRequests": 90,
            "NeuronServeModelMs": 900.0,
            "NeuronServeTokenizeMs": 9.0,
            "NeuronServeHandlerMs": 1000.0,
        },
    }
    end = {
        "cpu": {"workers": 12.0, "frontend": 2.5},
        "metrics": {
            "ts_inference_requests_total": 150,
            "ts_queue_latency_microseconds": 6e5,
            "ts_inference_latency_microseconds": 3e6,
            "NeuronServeRequests": 140,
            "NeuronServeModelMs": 1400.0,
            "NeuronServeTokenizeMs": 14.0,
            "NeuronServeHandlerMs": 1600.0,
        },
    }
    split = time_split(start, end, requests=40, client_cpu_s=0.2)
    assert split["cpu_ms_per_req_workers"] == pytest.approx(2000 / 40)
    assert split["cpu_ms_per_req_frontend"] == pytest.approx(500 / 40)
    assert split["cpu_ms_per_req_client"] == pytest.approx(200 / 40)
    assert split["queue_ms"] == pytest.approx(100 / 50)  # 1e5 us over 50 served
    assert split["server_ms"] == pytest.approx(1000 / 50)
    assert split["model_ms"] == pytest.approx(500 / 50)
    assert split["tokenize_ms"] == pytest.approx(5 / 50)
    assert split["handler_ms"] == pytest.approx(600 / 50)


def test_time_split_reads_tritons_counters_and_metric_names():
    def scraped(served, queue_us, server_us, handled, model_ms):
        return {
            "cpu": {"workers": 0.0},
            "metrics": {
                "nv_inference_request_success": served,
                "nv_inference_queue_duration_us": queue_us,
                "nv_inference_request_duration_us": server_us,
                "neuronserve_requests": handled,
                "neuronserve_model_ms": model_ms,
                "neuronserve_handler_ms": model_ms * 1.5,
                "neuronserve_tokenize_ms": 0.0,
            },
        }

    split = time_split(scraped(10, 1e3, 1e5, 10, 50.0), scraped(30, 5e3, 5e5, 30, 250.0), 20, 0.0)
    assert split["queue_ms"] == pytest.approx(4 / 20)  # 4000 us over 20 served
    assert split["server_ms"] == pytest.approx(400 / 20)
    assert split["model_ms"] == pytest.approx(200 / 20)
    assert split["handler_ms"] == pytest.approx(300 / 20)


def test_lone_request_and_baseline_tables():
    from neuronserve.bench.report import baseline_check, lone_request_table

    points = [
        {"endpoint": "ts", "seq": 8, "texts": 1, "concurrency": 1, "p50_ms": 9.5, "model_ms": 5.0},
        {"endpoint": "ts", "seq": 8, "texts": 1, "concurrency": 16, "p50_ms": 40, "model_ms": 4},
        {"endpoint": "tr", "seq": 8, "texts": 1, "concurrency": 1, "p50_ms": 7.0},
        {
            "endpoint": "vanilla",
            "seq": 8,
            "texts": 1,
            "req_per_s": 48.0,
            "plain_loop_req_per_s": 50.0,
            "torch_threads": 2,
        },
    ]
    lone = lone_request_table(points)
    # concurrency 1 rows with a model time only: p50 and what it pays beyond the model
    assert [ln for ln in lone if ln.startswith("| ts")] == ["| ts | 8 | 9.5 | 5.0 | 4.5 |"]
    assert not [ln for ln in lone if ln.startswith("| tr")]
    check = baseline_check(points)
    assert "| vanilla | 8 | 1 | 2 | 48.0 | 50.0 | 0.960 |" in check


def test_ratios_are_against_vanilla_at_the_same_length_and_texts():
    rows = [
        {"type": "vanilla", "endpoint": "v", "seq": 8, "texts": 1, "req_per_s": 40.0},
        {"type": "vanilla", "endpoint": "v", "seq": 128, "texts": 1, "req_per_s": 10.0},
        {
            "type": "torchserve",
            "endpoint": "t",
            "seq": 8,
            "texts": 1,
            "concurrency": 1,
            "req_per_s": 100.0,
        },
        {
            "type": "torchserve",
            "endpoint": "t",
            "seq": 8,
            "texts": 1,
            "concurrency": 8,
            "req_per_s": 300.0,
        },
        {
            "type": "torchserve",
            "endpoint": "t",
            "seq": 128,
            "texts": 1,
            "concurrency": 8,
            "req_per_s": 35.0,
        },
        {
            "type": "torchserve",
            "endpoint": "t",
            "seq": 128,
            "texts": 4,
            "concurrency": 8,
            "req_per_s": 9.0,
        },
    ]
    _add_ratios(rows)
    assert [r.get("ratio_vs_vanilla") for r in rows] == [1.0, 1.0, 2.5, 7.5, 3.5, None]
    best = best_by_seq(rows)
    assert best["t"][8]["concurrency"] == 8 and best["t"][128]["req_per_s"] == 35.0


def test_endpoint_specs_parse_and_refuse_unknown_types():
    e = parse_endpoint("base=torchserve:http://127.0.0.1:8080/predictions/m")
    assert (e.label, e.type, e.where) == (
        "base",
        "torchserve",
        "http://127.0.0.1:8080/predictions/m",
    )
    e = parse_endpoint("triton-grpc:127.0.0.1:8001/m")
    assert (e.label, e.type, e.where) == ("triton-grpc", "triton-grpc", "127.0.0.1:8001/m")
    with pytest.raises(ValueError, match="unknown type"):
        parse_endpoint("tgi:http://x")
    with pytest.raises(ValueError, match="TYPE:WHERE"):
        parse_endpoint("torchserve")


def test_wrk_output_is_read_in_its_units():
    out = """Running 5s test @ http://127.0.0.1:1/predictions/m
  1 threads and 16 connections
  Latency Distribution
     50%   30.62ms
     75%   40.10ms
     90%  812.00us
     99%    1.20s
  2365 requests in 5.00s, 1.2MB read
  Non-2xx or 3xx responses: 3
Requests/sec:    473.04
"""
    got = wrk.parse(out)
    assert got == {
        "req_per_s": 473.04,
        "requests": 2365,
        "p50_ms": 30.62,
        "p90_ms": pytest.approx(0.812),
        "p99_ms": 1200.0,
        "non_2xx": 3,
    }


class CountingEndpoint(Endpoint):
    """An in-process endpoint that fails every third call and records which threads call."""

    type = "counting"

    def __init__(self):
        super().__init__("counting")
        self.calls = 0
        self.threads: set[int] = set()
        self.lock = threading.Lock()

    def payload(self, texts):
        return texts

    def connect(self):
        def send(_payload):
            with self.lock:
                self.calls += 1
                n = self.calls
                self.threads.add(threading.get_ident())
            if n % 3 == 0:
                raise RequestFailed("every third fails")

        return send


def test_load_counts_successes_and_failures_from_every_thread():
    e = CountingEndpoint()
    r = run_load(
        e,
        ["x"],
        concurrency=4,
        window=Window(warmup_s=0.05, duration_s=0.1, min_requests=30, max_duration_s=30),
    )
    counted = len(r.latencies_ms) + r.errors
    assert counted >= 30 and r.errors >= 1
    # warm-up calls are not counted; failures are about a third of what was counted
    assert counted < e.calls
    assert abs(r.errors / counted - 1 / 3) < 0.15
    assert len(e.threads) == 4 and r.wall_s > 0 and r.client_cpu_s >= 0


def test_spread_compares_engines_run_by_run_and_derives_the_lone_request_cost():
    from neuronserve.bench.spread import markdown

    def run(ts, http, grpc, started):
        point = {"seq": 8, "texts": 1, "concurrency": 16}
        return {
            "command": "neuronserve bench ...",
            "started": started,
            "machine": {"cpu": "cpu", "cores": 2},
            "points": [
                {**point, "endpoint": "ts", "type": "torchserve", "req_per_s": ts},
                {**point, "endpoint": "tr http", "type": "triton-http", "req_per_s": http},
                {**point, "endpoint": "tr grpc", "type": "triton-grpc", "req_per_s": grpc},
                {
                    **point,
                    "concurrency": 1,
                    "endpoint": "ts",
                    "type": "torchserve",
                    "req_per_s": 90.0,
                    "p50_ms": 10.0,
                    "model_ms": 6.0,
                },
            ],
        }

    # each run's TorchServe against the faster Triton protocol of that same run
    md = markdown([run(90, 100, 80, "a"), run(60, 50, 75, "b"), run(100, 100, 100, "c")])
    assert "| 8 | 1 | 16 | 0.90 (0.80-1.00) |" in md
    lone = (
        "| ts | 8 | 1 | 1 | 90.0 (90.0-90.0) | 10.0 (10.0-10.0) | 6.0 (6.0-6.0) | 4.0 (4.0-4.0) |"
    )
    assert lone in md
