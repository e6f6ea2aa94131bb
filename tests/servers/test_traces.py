"""Traces over OTLP, as an operator collects them: `serve front` with
`front.otlp_endpoint` pointed at an OTLP/gRPC receiver, or OpenTelemetry's own variables
at an OTLP/HTTP one (OpenTelemetry's protocol definitions, served by grpcio or
http.server in this test, standing where a collector would). A request
carrying a client's `traceparent` arrives as one trace continuing it: the front's
stages, the engine call, and the worker's queue, tokenizing, padding and device call
with its bucket, each inside the call that holds it."""

from __future__ import annotations

import http.server
import os
import threading
from concurrent import futures

import grpc
import pytest
import requests
from helpers import free_port, run_cli, write_spec
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

pytestmark = pytest.mark.server

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.got: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.lock = threading.Lock()

    def Export(self, request, context):
        with self.lock:
            self.got.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list:
        with self.lock:
            return [
                (resource.resource, span)
                for req in self.got
                for resource in req.resource_spans
                for scope in resource.scope_spans
                for span in scope.spans
            ]


def _http_receiver(found: Receiver, port: int) -> http.server.ThreadingHTTPServer:
    """OTLP over HTTP: protobuf bodies POSTed to /v1/traces."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            ok = self.path == "/v1/traces"
            if ok:
                found.Export(trace_service_pb2.ExportTraceServiceRequest.FromString(body), None)
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# the protocols traces travel over
PROTOCOLS = ["grpc", "http/protobuf"]


@pytest.fixture(params=PROTOCOLS)
def receiver(request):
    """A receiver of the protocol; gRPC is named in the spec, HTTP by OpenTelemetry's own
    variables (the general endpoint, a base URL, and the protocol)."""
    protocol = request.param
    port, found = free_port(), Receiver()
    if protocol == "grpc":
        server = grpc.server(futures.ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(found, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        yield found, protocol, f"http://127.0.0.1:{port}"
        server.stop(0)
    else:
        web = _http_receiver(found, port)
        yield found, protocol, f"http://127.0.0.1:{port}"
        web.shutdown()


def _attributes(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = v.string_value or v.int_value or v.bool_value or v.double_value
    return out


def test_a_request_is_one_trace_down_to_the_device(tmp_path, tiny_artifact, receiver):
    found, protocol, endpoint = receiver
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    front = {"otlp_endpoint": endpoint, "otlp_service_name": "embeddings-test"}
    if protocol != "grpc":
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
            OTEL_SERVICE_NAME="embeddings-test",
        )
        front, endpoint = {}, f"{endpoint}/v1/traces"
    write_spec(
        tmp_path,
        front_port=port,
        front_run_dir="front",
        workers=1,
        front=front,
    )
    run_cli("serve", "front", tiny_artifact, "--spec", "deploy.yaml", cwd=tmp_path, env=env)
    try:
        log = (tmp_path / "front" / "front.log").read_text()
        said = f"traces of every request go to {endpoint} (OTLP, {protocol}) as embeddings-test"
        assert said in log
        r = requests.post(
            f"http://127.0.0.1:{port}/embed",
            json={"inputs": ["one text", "and another"]},
            headers={"traceparent": PARENT},
            timeout=60,
        )
        assert r.status_code == 200
    finally:
        # the front sends what is left when it stops
        run_cli("serve", "front", "--spec", "deploy.yaml", "--stop", cwd=tmp_path, env=env)
    spans = [(res, s) for res, s in found.spans() if s.trace_id.hex() == TRACE_ID]
    assert spans, f"no span of the request's trace among {len(found.spans())}"
    services = {kv.value.string_value for res, _ in spans for kv in res.attributes
                if kv.key == "service.name"}  # fmt: skip
    assert services == {"embeddings-test"}
    by_name = {s.name: s for _, s in spans}
    root = by_name["POST /embed"]
    assert root.parent_span_id.hex() == "b7ad6b7169203331"  # the client's own span
    assert _attributes(root)["http.response.status_code"] == 200
    call = by_name["neuronserve.workers.call"]
    for stage in ("worker.queue", "tokenize", "pad", "device", "batch"):
        span = by_name[f"neuronserve.{stage}"]
        assert span.parent_span_id == call.span_id, stage
        # the worker's clock is the host's: its stages lie inside the call
        assert call.start_time_unix_nano <= span.start_time_unix_nano
        assert span.end_time_unix_nano <= call.end_time_unix_nano, stage
    # the two rows in one device call or two, as the artifact's bucket times make cheapest
    devices = [_attributes(s) for _, s in spans if s.name == "neuronserve.device"]
    assert sum(d["neuronserve.rows"] for d in devices) == 2
    assert all("x" in d["neuronserve.bucket"] for d in devices)
    assert _attributes(by_name["neuronserve.tokenize"])["neuronserve.texts"] == 2
