"""`neuronserve bench`: the arithmetic of its reports and its load generator's counting
(servers/test_bench_servers.py runs it against real servers). No test asserts a time."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from neuronserve.bench.report import best_by_seq
from neuronserve.bench.run import BenchConfig, _add_ratios, _sessions, parse_endpoint, time_split
from neuronserve.load import wrk
from neuronserve.load.endpoints import Endpoint, RequestFailed
from neuronserve.load.generator import Window, run_load
from neuronserve.load.work import Batch

PNG = b"\x89PNG\r\n\x1a\n"


def test_time_split_divides_window_deltas_by_requests():
    start = {"cpu": {"workers": 10.0, "front": 2.0}}
    end = {"cpu": {"workers": 12.0, "front": 2.5}}
    split = time_split(start, end, requests=40, client_cpu_s=0.2)
    assert split["cpu_ms_per_req_workers"] == pytest.approx(2000 / 40)
    assert split["cpu_ms_per_req_front"] == pytest.approx(500 / 40)
    assert split["cpu_ms_per_req_client"] == pytest.approx(200 / 40)


def test_baseline_table():
    from neuronserve.bench.report import baseline_check

    points = [
        {"endpoint": "front", "seq": 8, "texts": 1, "concurrency": 1, "p50_ms": 9.5},
        {
            "endpoint": "vanilla",
            "seq": 8,
            "texts": 1,
            "req_per_s": 48.0,
            "plain_loop_req_per_s": 50.0,
            "torch_threads": 2,
        },
    ]
    check = baseline_check(points)
    assert "| vanilla | 8 | 1 | 2 | 48.0 | 50.0 | 0.960 |" in check


def test_ratios_are_against_vanilla_at_the_same_length_and_texts():
    rows = [
        {"type": "vanilla", "endpoint": "v", "seq": 8, "texts": 1, "req_per_s": 40.0},
        {"type": "vanilla", "endpoint": "v", "seq": 128, "texts": 1, "req_per_s": 10.0},
        {
            "type": "front",
            "endpoint": "t",
            "seq": 8,
            "texts": 1,
            "concurrency": 1,
            "req_per_s": 100.0,
        },
        {
            "type": "front",
            "endpoint": "t",
            "seq": 8,
            "texts": 1,
            "concurrency": 8,
            "req_per_s": 300.0,
        },
        {
            "type": "front",
            "endpoint": "t",
            "seq": 128,
            "texts": 1,
            "concurrency": 8,
            "req_per_s": 35.0,
        },
        {
            "type": "front",
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
    e = parse_endpoint("base=sagemaker:http://127.0.0.1:8080/invocations")
    assert (e.label, e.type, e.where) == ("base", "sagemaker", "http://127.0.0.1:8080/invocations")
    e = parse_endpoint("front-native:artifacts/m")  # the name earlier commands used
    assert (e.label, e.type, e.where) == ("front-native", "front-native", "artifacts/m")
    # a peer's OpenAI-style route gets OpenAI's body: {"input": ...}
    e = parse_endpoint("infinity=openai:http://127.0.0.1:7997/embeddings")
    (session,) = _sessions(e, BenchConfig(endpoints=[e], sequence_lengths=[8]))
    (endpoint,) = session.make()
    assert (endpoint.type, endpoint.url) == ("openai", "http://127.0.0.1:7997/embeddings")
    assert json.loads(endpoint.payload(Batch("feature-extraction", ("a text",)))) == {
        "input": "a text"
    }
    # the servers neuronserve no longer starts or measures
    for gone in ("tgi:http://x", "torchserve:artifacts/m", "triton-grpc:127.0.0.1:8001/m"):
        with pytest.raises(ValueError, match="unknown type"):
            parse_endpoint(gone)
    with pytest.raises(ValueError, match="TYPE:WHERE"):
        parse_endpoint("front")


def test_a_running_servers_endpoint_goes_where_the_command_line_named():
    config = BenchConfig(endpoints=[], sequence_lengths=[8])
    sm = parse_endpoint("sagemaker:http://127.0.0.1:8080/invocations")
    ((endpoint,),) = [s.make() for s in _sessions(sm, config)]
    assert (endpoint.type, endpoint.url) == ("sagemaker", "http://127.0.0.1:8080/invocations")


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


def test_a_wrk_point_short_of_its_minimum_count_is_measured_again_for_longer(monkeypatch):
    """wrk stops on the clock alone: a window of 1 s that got 4 answers where 5 were asked
    is measured again for 2 s, and the point is that second window, probed around it."""
    from neuronserve.bench.run import _wrk_point

    asked, probes = [], []
    counts = iter([4, 9])

    def fake_wrk(request, c, seconds):
        asked.append(seconds)
        n = next(counts)
        return {
            "requests": n, "non_2xx": 0, "socket_errors": 0, "wall_s": float(seconds),
            "req_per_s": n / seconds, "cpu_s": 0.01,
            "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "max_ms": 4.0, "mean_ms": 1.5,
        }  # fmt: skip

    monkeypatch.setattr(wrk, "run_wrk", fake_wrk)
    window = Window(warmup_s=0, duration_s=0.5, min_requests=5, max_duration_s=60)
    row = _wrk_point(object(), 2, window, lambda: probes.append(1) or {"cpu": {}, "metrics": {}}, 1)
    assert asked == [0.5, 2]
    assert row["requests"] == 9 and row["wall_s"] == 2.0 and row["errors"] == 0
    assert len(probes) == 4  # around each window
    # a point that cannot reach the count stops once its windows took the longest one
    counts = iter([1, 1, 1])
    asked.clear()
    short = Window(warmup_s=0, duration_s=1, min_requests=100, max_duration_s=7)
    assert _wrk_point(object(), 1, short, lambda: {"cpu": {}, "metrics": {}}, 1)["requests"] == 1
    assert asked == [1, 2, 4]


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


def test_spread_derives_the_lone_request_cost_run_by_run(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "scripts"))  # a benchmark script's
    from spread import markdown

    def run(started):
        return {
            "command": "neuronserve bench ...",
            "started": started,
            "machine": {"cpu": "cpu", "cores": 2},
            "peak_gops": {"1": {"fp32": 50.0, "int8": 100.0}},
            "points": [
                {
                    "seq": 8,
                    "texts": 1,
                    "concurrency": 1,
                    "endpoint": "front",
                    "type": "front",
                    "req_per_s": 90.0,
                    "p50_ms": 10.0,
                    "model_ms": 6.0,
                    "model_gflop": 0.3,
                    "cores_per_worker": 1,
                },
            ],
        }

    md = markdown([run("a"), run("b"), run("c")])
    # 0.3 GOP at the int8 peak of 100 GOP/s is 3 ms: the model's 6 ms is twice its floor
    lone = (
        "| front | 8 | 1 | 1 | 90.0 (90.0-90.0) | 10.0 (10.0-10.0) | 6.0 (6.0-6.0) | 4.0 (4.0-4.0) "
        "| 2.0 (2.0-2.0) |"
    )
    assert lone in md


def test_encoder_arithmetic_equals_torchs_flop_count_of_the_model():
    """bench/floor.py's formula against torch's own count of the matmuls a BERT runs
    (FlopCounterMode, attention included), on a small random model at two lengths."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import BertConfig, BertModel

    from neuronserve.bench.floor import encoder_gflop

    config = BertConfig(
        vocab_size=500,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=256,
        add_pooling_layer=False,
    )
    # eager attention: its two matmuls are counted like the others
    config._attn_implementation = "eager"
    model = BertModel(config, add_pooling_layer=False).eval()
    for seq in (16, 96):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.ones(2, seq, dtype=torch.long))
        counted = counter.get_total_flops() / 1e9
        assert encoder_gflop(config.to_dict(), seq, batch=2) == pytest.approx(counted, rel=1e-6)
    # DistilBERT names the same sizes differently
    distil = {"dim": 64, "hidden_dim": 256, "n_layers": 3}
    assert encoder_gflop(distil, 16) == encoder_gflop(config.to_dict(), 16)


def test_peak_probe_measures_every_precision_and_leaves_torchs_threads_alone():
    import torch

    from neuronserve.bench.floor import peak_gops

    before = torch.get_num_threads()
    # one small shape: what is checked is that each precision is probed, not the peak
    peaks = peak_gops(1, repeats=1, shapes=((64, 128, 128),))
    assert set(peaks) == {"fp32", "bf16", "int8"} and all(v > 0 for v in peaks.values())
    assert torch.get_num_threads() == before


def test_floor_table_sets_model_time_against_the_probe():
    from neuronserve.bench.report import floor_table

    point = {
        "endpoint": "front",
        "seq": 128,
        "concurrency": 1,
        "texts": 1,
        "model_ms": 20.0,
        "model_gflop": 2.0,
        "precision": "fp32",
        "cores_per_worker": 1,
    }
    results = {
        "points": [point, {**point, "concurrency": 16}],
        "peak_gops": {"1": {"fp32": 100.0, "bf16": 1.0, "int8": 200.0}},
    }
    table = floor_table(results)
    (row,) = [line for line in table if line.startswith("| front")]
    # 2 GOP at 200 GOP/s int8 is 10 ms (model 2.0x that); at fp32's 100 GOP/s 20 ms (1.0x)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == [
        "front",
        "128",
        "fp32",
        "20.00",
        "2.000",
        "100.0",
        "10.00",
        "2.0",
        "20.00",
        "1.0",
    ]
    assert floor_table({"points": [point], "peak_gops": None}) == []


def test_a_lone_in_process_client_runs_on_the_calling_thread():
    """The vanilla baseline is timed on the thread a user's own loop would use (torch is
    slower from a second thread); its counts follow the same window rules."""
    e = CountingEndpoint()
    e.in_process = True
    window = Window(warmup_s=0.05, duration_s=0.1, min_requests=30, max_duration_s=30)
    r = run_load(e, ["x"], concurrency=1, window=window, probe=lambda: e.calls)
    assert e.threads == {threading.get_ident()}
    counted = len(r.latencies_ms) + r.errors
    assert counted >= 30 and counted < e.calls  # warm-up calls are not counted
    assert abs(r.errors / counted - 1 / 3) < 0.15
    # the probe saw the window open after the warm-up and close after the last call
    assert r.probe_start < r.probe_end == e.calls
    # at more than one client, every client has a thread of its own
    e2 = CountingEndpoint()
    e2.in_process = True
    run_load(e2, ["x"], concurrency=2, window=window)
    assert len(e2.threads) == 2 and threading.get_ident() not in e2.threads


@pytest.mark.parametrize(
    "task",
    [
        "feature-extraction",
        "text-classification",
        "token-classification",
        "fill-mask",
        "rerank",
        "question-answering",
        "image-classification",
    ],
)
def test_every_tasks_bench_request_is_one_its_server_takes(task):
    """The body bench sends natively parses as the task's request with one item per
    text asked for."""
    from neuronserve.load.work import Work
    from neuronserve.tasks import get_task

    work = Work(task, {16: "the river bank was quiet that morning"}, mask="[MASK]")
    batch = work.batch(16, 3)
    t = get_task(task)
    request = t.parse(*t.decode(batch.native, "application/json"))
    assert len(request.texts) == 3 and not request.single
    if task == "fill-mask":
        assert all("[MASK]" in x for x in request.texts)


def test_soak_judges_memory_of_workers_loaded_before_a_short_run(monkeypatch):
    """A worker serving when the run began is sampled from warm-up on; one started during
    the run (a replacement) only after it has had LOAD_GRACE_S to load. A 7 s run judged
    no worker when every worker waited out the grace."""
    import asyncio
    import types

    import psutil

    from neuronserve.bench import soak

    me = psutil.Process()
    present = [me]
    samples = []

    class Here(soak.SoakTarget):
        def workers(self) -> list[psutil.Process]:
            samples.append(list(present))
            return list(present)

    checker = types.SimpleNamespace(add=lambda texts: json.dumps(texts).encode())
    target = Here("here", "http://127.0.0.1:9/")
    run = soak._Run(soak.SoakOptions(requests=10), target, checker, 100)
    run.warm = True
    monkeypatch.setattr(soak, "LOAD_GRACE_S", 60.0)
    # who is sampled, not how memory grows: no need to wait the real spacing
    monkeypatch.setattr(soak, "MEMORY_SAMPLE_S", 0.05)

    async def until(n: int) -> None:
        deadline = time.monotonic() + 30
        while len(samples) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def sample() -> None:
        task = asyncio.create_task(run.sample_memory())
        await until(1)
        present.append(psutil.Process(os.getppid()))  # stands for a worker started mid-run
        await until(3)  # the newcomer seen twice, inside its grace
        task.cancel()

    asyncio.run(sample())
    assert [len(s) for s in samples[:3]] == [1, 2, 2]
    run.memory_report(wall_s=1.5 * soak.MEMORY_SAMPLE_S)  # judged past a third of the run
    assert list(run.report.memory_mb_warm) == [str(me.pid)]
    assert run.report.memory_growth_pct is not None

    # past its grace, a newcomer still waits until the engine calls every worker ready
    monkeypatch.setattr(soak, "LOAD_GRACE_S", 0.0)
    target.workers_ready = lambda: (1, 2)
    present[:], samples[:] = [me], []
    asyncio.run(sample())
    assert str(os.getppid()) not in run.memory
    run.report.recovered_s = 1.0
    present[:], samples[:] = [me], []
    asyncio.run(sample())
    assert str(os.getppid()) in run.memory


def test_a_session_with_errors_keeps_the_tail_of_each_log_and_nothing_else(tmp_path):
    from neuronserve.bench.servers import keep_logs

    server = tmp_path / "server"
    (server / "engine" / "logs").mkdir(parents=True)
    (server / "engine" / "logs" / "ts_log.log").write_bytes(b"0123456789the end")
    (server / "front.log").write_text("front")  # shorter than the tail: whole
    (server / "engine" / "model.bin").write_bytes(b"weights")
    kept = keep_logs(server, tmp_path / "kept", most_bytes=7)
    names = sorted(p.relative_to(tmp_path / "kept").as_posix() for p in kept)
    assert names == ["engine/logs/ts_log.log", "front.log"]
    assert (tmp_path / "kept" / "engine" / "logs" / "ts_log.log").read_bytes() == b"the end"
    assert (tmp_path / "kept" / "front.log").read_text() == "front"
