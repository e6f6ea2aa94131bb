"""An OTLP/gRPC receiver that only counts what it is sent, for measuring what traces
cost (scripts/benchmark_tracing.sh): a collector's own cost stays out of the figures.

    python scripts/otlp_sink.py PORT COUNT_FILE    # until SIGTERM; the span count in COUNT_FILE
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans = 0
        self.lock = threading.Lock()

    def Export(self, request, context):  # the protocol's name
        n = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self.lock:
            self.spans += n
        return trace_service_pb2.ExportTraceServiceResponse()


def main(port: int, count_file: Path) -> None:
    sink = Sink()
    server = grpc.server(futures.ThreadPoolExecutor(1))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    server.stop(1)
    count_file.write_text(f"{sink.spans}\n")


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
