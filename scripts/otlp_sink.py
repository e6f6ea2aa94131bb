"""An OTLP/gRPC receiver that only counts what it is sent, for measuring what traces
cost (scripts/benchmark_tracing.sh): a collector's own cost stays out of the figures.
With STAGES_FILE it also keeps the spans, and writes where each request's time went: for
every span name, the median of its start (from its request's span) and of its length
(scripts/trace_lone_requests.sh).

    python scripts/otlp_sink.py PORT COUNT_FILE [STAGES_FILE]   # until SIGTERM
"""

from __future__ import annotations

import signal
import statistics
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, keep: bool) -> None:
        self.spans = 0
        self.kept: list = []
        self.keep = keep
        self.lock = threading.Lock()

    def Export(self, request, context):  # the protocol's name
        spans = [s for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
        with self.lock:
            self.spans += len(spans)
            if self.keep:
                self.kept.extend(spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def stages(self) -> str:
        """Per span name: the median of its start after its request's span began and of
        its length, in microseconds, over the requests (the span without a parent)."""
        traces: dict[bytes, list] = {}
        for span in self.kept:
            traces.setdefault(span.trace_id, []).append(span)
        starts: dict[str, list[float]] = {}
        lengths: dict[str, list[float]] = {}
        for spans in traces.values():
            roots = [s for s in spans if not s.parent_span_id]
            if len(roots) != 1:
                continue
            t0 = roots[0].start_time_unix_nano
            for s in spans:
                starts.setdefault(s.name, []).append((s.start_time_unix_nano - t0) / 1e3)
                lengths.setdefault(s.name, []).append(
                    (s.end_time_unix_nano - s.start_time_unix_nano) / 1e3
                )
        lines = [
            f"{len(traces)} traces; medians in microseconds",
            "",
            "| span | starts after the request's | lasts |",
            "|---|---:|---:|",
        ]
        for name in sorted(starts, key=lambda n: statistics.median(starts[n])):
            lines.append(
                f"| {name} | {statistics.median(starts[name]):.0f} | "
                f"{statistics.median(lengths[name]):.0f} |"
            )
        return "\n".join(lines) + "\n"


def main(port: int, count_file: Path, stages_file: Path | None = None) -> None:
    sink = Sink(keep=stages_file is not None)
    server = grpc.server(futures.ThreadPoolExecutor(1))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    server.stop(1)
    count_file.write_text(f"{sink.spans}\n")
    if stages_file is not None:
        stages_file.write_text(sink.stages())


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
