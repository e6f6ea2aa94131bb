"""Traces of the front's requests (OpenTelemetry, exported by the SDK; here to its
in-memory exporter): one trace per request continuing the client's `traceparent`, a span
per stage, the request's status and model on its span; joined requests each have a
trace; a native worker's stages come back with a traced request's answer only. Over
OTLP to a collector, on the native engine's real workers: tests/servers/test_traces.py."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future

import pytest
from in_process_front import front
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from test_front_coalescing import Recording
from test_workers_wire import POLICY, FakeWorker, Peer, _serving

from neuronserve.execution import RunReport
from neuronserve.tracing import TRACING, Tracing, TracingUnavailable, parse_stages, settings
from neuronserve.workers.wire import frame

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    TRACING.start(None, "neuronserve-test", exporter=exporter)
    try:
        yield exporter
    finally:
        TRACING.stop()


def _by_trace(exporter: InMemorySpanExporter) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in exporter.get_finished_spans():
        out.setdefault(format(s.context.trace_id, "032x"), []).append(s)
    return out


def test_a_request_is_one_trace_continuing_the_clients_with_a_span_per_stage(
    tmp_path, tiny_runner, spans
):
    client, _, _ = front(tmp_path, {"tiny": tiny_runner})
    r = client.post("/embed", json={"inputs": ["one", "two"]}, headers={"traceparent": PARENT})
    assert r.status_code == 200
    [trace] = _by_trace(spans).values()
    root = next(s for s in trace if s.kind == SpanKind.SERVER)
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert format(root.parent.span_id, "016x") == "00f067aa0ba902b7"  # the client's span
    assert root.name == "POST /embed"
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["neuronserve.model"] == "tiny"
    names = {s.name for s in trace if s is not root}
    assert {
        "neuronserve.read",
        "neuronserve.parse",
        "neuronserve.workers",
        "neuronserve.workers.call",
        "neuronserve.answer",
    } <= names
    engine = next(s for s in trace if s.name == "neuronserve.workers")
    call = next(s for s in trace if s.name == "neuronserve.workers.call")
    assert call.parent.span_id == engine.context.span_id
    assert engine.attributes["neuronserve.texts"] == 2
    assert call.attributes["neuronserve.requests"] == 1
    for s in trace:  # every stage inside the request's own time
        assert root.start_time <= s.start_time <= s.end_time <= root.end_time


def test_a_refused_request_has_its_trace_and_status_and_nothing_is_traced_when_off(
    tmp_path, tiny_runner, spans
):
    client, _, _ = front(tmp_path, {"tiny": tiny_runner})
    r = client.post("/embed", json={"inputs": []})
    assert r.status_code == 400
    [trace] = _by_trace(spans).values()
    root = next(s for s in trace if s.kind == SpanKind.SERVER)
    assert root.attributes["http.response.status_code"] == 400
    assert "neuronserve.workers.call" not in {s.name for s in trace}
    TRACING.stop()
    spans.clear()
    assert client.post("/embed", json={"inputs": "untraced"}).status_code == 200
    assert spans.get_finished_spans() == ()


def test_requests_joined_in_one_engine_call_each_have_their_trace(tmp_path, tiny_runner, spans):
    _, _, serving = front(tmp_path, {"tiny": tiny_runner})
    serving.attach(serving.models, Recording({"tiny": tiny_runner}))  # a call takes a moment
    model = serving.models["tiny"]

    async def one(i: int):
        with TRACING.request(f"request {i}", {}, {}):
            return await serving.predict(model, [f"text {i}"], {})

    async def together():
        return await asyncio.gather(*(one(i) for i in range(4)))

    assert len(asyncio.run(together())) == 4
    traces = _by_trace(spans)
    assert len(traces) == 4
    calls = [s for t in traces.values() for s in t if s.name == "neuronserve.workers.call"]
    joined = [s for t in traces.values() for s in t if s.name == "neuronserve.joined"]
    # the first went at once, alone; the three that came while it was at the engine went
    # as one call, in the trace of the first of them, and each of them waited for it
    assert sorted(s.attributes["neuronserve.requests"] for s in calls) == [1, 3]
    assert len(joined) == 3
    # the joined call links the traces of the requests it carries, each at its wait
    [shared] = [s for s in calls if s.attributes["neuronserve.requests"] == 3]
    linked = {(link.context.trace_id, link.context.span_id) for link in shared.links}
    assert linked == {(s.context.trace_id, s.context.span_id) for s in joined}
    # and lies in the trace of the request that opened the group, one of them
    assert shared.context.trace_id in {s.context.trace_id for s in joined}
    for trace in traces.values():
        names = {s.name for s in trace}
        assert "neuronserve.workers" in names and "neuronserve.answer" in names


class _Reporting(FakeWorker):
    """A FakeWorker whose batches report a Runner's stages."""

    def start(self, requests, report) -> Future:
        run = RunReport()
        now = time.time_ns()
        run.stages += [("tokenize", now, now + 1000, {"texts": 1}), ("device", now, now + 5, {})]
        report("m", run)
        return super().start(requests, report)


def test_a_native_worker_sends_its_stages_with_a_traced_answer_only(tmp_path):
    worker = _Reporting()
    _, run = _serving(tmp_path, worker, POLICY)

    async def body(path):
        peer = await Peer.to(path)
        head = {"op": "infer", "id": 1, "model": "m", "texts": ["traced"], "trace": True}
        peer.writer.write(frame(head))
        traced = await peer.answers(1)
        peer.send(2, ["plain"])
        plain = await peer.answers(1)
        return traced[1][0], plain[2][0]

    traced, plain = asyncio.run(run(body))
    assert "stages" not in plain
    stages = parse_stages(traced["stages"], worker=3)
    names = [s[0] for s in stages]
    assert names == ["worker.queue", "tokenize", "device", "batch"]
    queue, batch = stages[0], stages[-1]
    assert queue[1] <= queue[2] == batch[1] <= batch[2]
    assert all(s[3]["worker"] == 3 for s in stages)
    assert stages[1][3]["model"] == "m" and batch[3]["requests"] == 1


def test_what_is_not_a_stage_is_left_out():
    good = ["tokenize", 1, 2, {}]
    given = [good, ["x", "1", 2, {}], ["y", 1, 2], "z", [3, 1, 2, {}], ["w", 1, 2, []]]
    assert parse_stages(given, worker=0) == [("tokenize", 1, 2, {"worker": 0})]
    assert parse_stages({"not": "a list"}, worker=0) == []


def test_an_endpoint_without_opentelemetry_says_what_to_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_otel(name, *args, **kwargs):
        if name.startswith("opentelemetry"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_otel)
    with pytest.raises(TracingUnavailable, match=r"neuronserve\[otel\]"):
        Tracing().start("http://localhost:4317")


def test_opentelemetrys_own_variables_fill_what_the_spec_leaves(monkeypatch):
    for var in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_SERVICE_NAME",
    ):
        monkeypatch.delenv(var, raising=False)
    assert settings(None, None, None) == (None, "grpc", "neuronserve")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "embedder")
    # the general endpoint is a base URL: the traces' path is added over HTTP
    assert settings(None, None, None) == (
        "http://collector:4318/v1/traces",
        "http/protobuf",
        "embedder",
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/x")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    assert settings(None, None, None)[:2] == ("http://traces:4318/x", "grpc")
    # what the spec says wins
    assert settings("http://mine:4317", "http/protobuf", "mine") == (
        "http://mine:4317",
        "http/protobuf",
        "mine",
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(TracingUnavailable, match="http/json"):
        settings(None, None, None)


def test_a_sampler_from_opentelemetrys_variables_decides_what_is_traced(
    tmp_path, tiny_runner, monkeypatch
):
    """Tracing every request costs the host (BENCHMARKS); OTEL_TRACES_SAMPLER takes a
    share, as the SDK defines it. A request left out asks no worker for its stages."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    exporter = InMemorySpanExporter()
    TRACING.start(None, "sampled", exporter=exporter)
    try:
        client, _, _ = front(tmp_path, {"tiny": tiny_runner})
        with TRACING.request("probe", {}, {}):
            assert not TRACING.recording()
        assert client.post("/embed", json={"inputs": "not traced"}).status_code == 200
        assert exporter.get_finished_spans() == ()
    finally:
        TRACING.stop()
