"""One real `neuronserve bench` run: the front on its workers, started by bench itself,
the Runner in process and the transformers pipeline; every report written. No test
asserts a time."""

from __future__ import annotations

import contextlib
import csv
import json
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from helpers import run_cli, wait_for

from neuronserve.bench.floor import encoder_gflop
from neuronserve.load import wrk
from neuronserve.load.generator import Window

PNG = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.server


MINILM_SHAPE = {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6}


def test_bench_runs_servers_and_the_runner_and_writes_every_report(
    tmp_path, minilm_artifact, minilm_dir
):
    out = tmp_path / "bench"
    run_cli(
        "bench",
        "-e",
        f"runner:{minilm_artifact}",
        "-e",
        f"vanilla:{minilm_dir}",
        "-e",
        f"front:{minilm_artifact}",
        "--sequence-lengths",
        "32",
        "--concurrency",
        "1,2",
        "--warmup",
        "0.5",
        "--server-warmup",
        "1",
        "--duration",
        "0.5",
        "--min-requests",
        "5",
        "--out",
        out,
    )
    data = json.loads((out / "results.json").read_text())
    points = data["points"]
    runner = [p for p in points if p["type"] == "runner"]
    front = [p for p in points if p["type"] == "front"]
    baseline = [p for p in points if p["baseline"]]
    # the full sweep for the server, one request at a time in process
    grid = {(32, 1), (32, 2)}
    assert {(p["seq"], p["concurrency"]) for p in front} == grid
    # the front's session: three routes on the same processes, /invocations the baseline
    assert {p["endpoint"].split(" ", 1)[1] for p in front} == {
        "/invocations",
        "/embed",
        "/v1/embeddings",
    }
    assert [p["endpoint"] for p in baseline] == ["front/throughput /invocations"] * 2
    for p in front:
        assert p["cpu_ms_per_req_front"] >= 0 and p["cpu_ms_per_req_workers"] > 0
        # the model's time per request, from the workers' counter on /metrics: some of
        # what a request took on average, never more (a lone request waits for nothing
        # else). Against the mean, not the median: one slow run lifts the counter's mean
        # above a median it leaves alone.
        if p["concurrency"] == 1:
            assert 0 < p["model_ms"] < p["mean_ms"], p
        if p["baseline"]:
            continue
        match = [
            d for d in baseline if (d["seq"], d["concurrency"]) == (p["seq"], p["concurrency"])
        ]
        assert p["ratio_vs_baseline"] == pytest.approx(p["req_per_s"] / match[0]["req_per_s"])
    # CPU time comes in 10 ms clock ticks, a half-second point may not reach one; the
    # session as a whole does
    assert sum(p["cpu_ms_per_req_front"] * p["requests"] for p in front) > 0
    assert {(p["seq"], p["concurrency"]) for p in runner} == {(32, 1)}
    # the baseline checked against a bare pipeline() loop, same process
    vanilla = [p for p in points if p["type"] == "vanilla"]
    assert {p["seq"] for p in vanilla} == {32}
    assert all(p["plain_loop_req_per_s"] > 0 and p["torch_threads"] >= 1 for p in vanilla)
    for p in front:
        assert p["ratio_vs_vanilla"] == pytest.approx(
            p["req_per_s"] / next(v["req_per_s"] for v in vanilla if v["seq"] == p["seq"])
        )
    for p in points:
        assert p["errors"] == 0 and p["requests"] >= 5
        assert p["p50_ms"] <= p["p95_ms"] <= p["p99_ms"] <= p["max_ms"]
        assert p["req_per_s"] == pytest.approx(p["requests"] / p["wall_s"])
    _check_reports(out, data, front)
    for png in ("p95_vs_sequence_length.png", "throughput_vs_concurrency.png"):
        assert (out / png).read_bytes()[:8] == PNG
    # wrk (where installed, as in CI) drives every HTTP point, bench's own the in-process
    # ones; its answers were all 200 (errors == 0 above) and its CPU share is reported
    if shutil.which("wrk"):
        assert {p["generator"] for p in front} == {"wrk"}
        assert all(0 < p["client_cores"] < 1.5 for p in front)
        assert data["wrk_check"] == {"skipped": "wrk drove every HTTP point"}
        assert "- load generator: wrk (C, one thread) for" in (out / "results.md").read_text()
    else:
        assert {p["generator"] for p in front} == {"python"}
        assert "not installed" in data["wrk_check"]["skipped"]
    assert {p["generator"] for p in points if p not in front} == {"python"}


def _check_reports(out, data, front):
    """results.csv and results.md hold every point and every table."""
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(data["points"])
    md = (out / "results.md").read_text()
    assert "front/throughput" in md and "Where the CPU goes" in md
    assert "The front's routes against its /invocations" in md
    assert "The baseline, checked" in md
    # the compute floor: the probe ran for the workers' core count, and the front's
    # requests carry the model's arithmetic (MiniLM: 6 layers of 384 wide, 1536 FFN)
    (threads,) = {str(p["cores_per_worker"]) for p in front}
    assert set(data["peak_gops"][threads]) == {"fp32", "bf16", "int8"}
    for p in front:
        assert p["model_gflop"] == pytest.approx(encoder_gflop(MINILM_SHAPE, p["seq"]))


def test_a_terminated_bench_stops_the_servers_it_started(tmp_path, tiny_artifact):
    """`kill` (SIGTERM) ends bench the way Ctrl-C does: the front, the supervisor and the
    workers it started are stopped, not left running on their cores."""
    log = tmp_path / "bench.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "neuronserve.cli", "bench", "-e", f"front:{tiny_artifact}",
             "--sequence-lengths", "16", "--concurrency", "1", "--warmup", "0",
             "--server-warmup", "0", "--duration", "600", "--out", str(tmp_path / "bench")],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    bench = psutil.Process(proc.pid)
    folder = None
    try:
        wait_for(lambda: "ready in" in log.read_text(), timeout=300, what="the servers")
        # measuring: the front, the supervisor (a session of its own) and its workers,
        # all named by the folder bench made for them
        [front] = [p for p in bench.children() if "front.server" in " ".join(p.cmdline())]
        folder = str(Path(front.cmdline()[-1]).parent.parent)
        started = _processes_naming(folder)
        kinds = {"supervisor" if "workers.supervisor" in c else "worker" if "workers.worker" in c
                 else "front" if "front.server" in c else c
                 for c in (" ".join(_cmdline(p)) for p in started)}  # fmt: skip
        assert kinds == {"front", "supervisor", "worker"}, kinds
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=240) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(started, timeout=60)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        for p in [bench, *(_processes_naming(folder) if folder else [])]:
            with contextlib.suppress(psutil.Error):
                p.kill()


def _processes_naming(folder: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter() if folder in " ".join(_cmdline(p))]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # gone, or not ours to read
        return []


class CountingServer:
    """A plain HTTP server that counts the POSTs it answers and keeps their bodies; it
    answers 500 to a body holding b"fail"."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with owner.lock:
                    owner.bodies.add(body)
                    owner.headers.add(self.headers.get("X-Key", ""))
                    owner.answered += 1
                status = 500 if b"fail" in body else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.lock = threading.Lock()
        self.bodies: set[bytes] = set()
        self.headers: set[str] = set()
        self.answered = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/predict"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.skipif(not wrk.available(), reason="wrk is not installed")
def test_a_point_driven_by_wrk_counts_what_the_server_answered_and_wrks_own_cpu():
    """wrk's body (binary, as Triton's tensors are) and headers reach the server as
    given; its count of answers is the server's (less those in flight when it stopped);
    non-2xx answers are errors; its own CPU time is reported."""
    from neuronserve.bench.run import _wrk_point

    server = CountingServer()
    probes = []
    try:
        body = bytes(range(256)) + "naïve ]==] café".encode()
        request = wrk.WrkRequest(server.url, body, {"X-Key": "k [[1]]"})
        row = _wrk_point(
            request,
            4,
            Window(warmup_s=0, duration_s=1),
            lambda: probes.append(1) or {"cpu": {}, "metrics": {}},
            2,
        )
        assert server.bodies == {body} and server.headers == {"k [[1]]"}
        assert row["requests"] > 20 and row["errors"] == 0
        assert server.answered - 4 <= row["requests"] <= server.answered
        assert row["req_per_s"] == pytest.approx(row["requests"] / row["wall_s"])
        assert row["texts_per_s"] == pytest.approx(2 * row["req_per_s"])
        assert row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"] <= row["max_ms"]
        assert 0 < row["client_cores"] < 1.5 and row["cpu_ms_per_req_client"] > 0
        assert len(probes) == 2  # as the window opened and as it closed
        failing = wrk.WrkRequest(server.url, b"fail", {})
        bad = _wrk_point(
            failing, 2, Window(warmup_s=0, duration_s=1), lambda: {"cpu": {}, "metrics": {}}, 1
        )
        assert bad["requests"] == 0 and bad["errors"] > 0 and "non-2xx" in bad["error_sample"]
    finally:
        server.close()
