"""OpenTelemetry traces of the requests the front serves, exported over OTLP (as
text-embeddings-inference's `--otlp-endpoint` does): one trace per request, continuing
the client's own (W3C `traceparent`), with a span for each stage a slow request can be
explained by: the front's guard and body read, parsing, the wait for the workers (joined
with others or alone), the call, and the worker's own stages (its queue, tokenizing and
padding, each device call with its bucket, the answer), which the worker times and
sends back with its answer frame; the front makes them spans of the call, so only the
front's process exports anything.

Off unless `front.otlp_endpoint` is set: then nothing imports OpenTelemetry and each
stage costs one attribute lookup. A worker records its stages on every batch (a few
clock reads) and sends them only for a request that asks.

A stage is `(name, start_ns, end_ns, attributes)` in the host's wall clock
(time.time_ns): the front and its workers share the host, so their times line up.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

# (name, start_ns, end_ns, attributes): a stage timed where it ran
Stage = tuple[str, int, int, dict[str, Any]]
_NAMESPACE = "neuronserve."
PROTOCOLS = ("grpc", "http/protobuf")


class TracingUnavailable(RuntimeError):
    pass


class Tracing:
    """The front's tracer: `span` and `stages` make spans when tracing is on, nothing
    otherwise (the default `OFF`)."""

    def __init__(self) -> None:
        self._tracer: Any = None
        self._provider: Any = None

    @property
    def on(self) -> bool:
        return self._tracer is not None

    def start(
        self,
        endpoint: str | None,
        service_name: str | None = None,
        protocol: str | None = None,
        exporter: SpanExporter | None = None,
    ) -> None:
        """Export spans to `endpoint` over OTLP (`protocol`: grpc, or http/protobuf whose
        endpoint is the collector's /v1/traces URL), or to `exporter` (tests). What is
        not given is read from OpenTelemetry's own variables, as its SDK defines them
        (`settings`); with no endpoint anywhere, nothing is traced."""
        endpoint, protocol, service_name = settings(endpoint, protocol, service_name)
        if endpoint is None and exporter is None:
            return
        try:
            from opentelemetry.sdk.resources import SERVICE_NAME, Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        except ImportError:
            raise TracingUnavailable(
                "traces need OpenTelemetry: pip install 'neuronserve[otel]'"
            ) from None
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            # spans leave in batches, off the event loop, on the SDK's own thread
            provider.add_span_processor(BatchSpanProcessor(_otlp(endpoint or "", protocol)))
        self._provider = provider
        self._tracer = provider.get_tracer("neuronserve")

    def stop(self) -> None:
        """Send what is left and stop exporting."""
        if self._provider is not None:
            self._provider.shutdown()
        self._provider = self._tracer = None

    @contextlib.contextmanager
    def request(
        self, name: str, headers: Mapping[bytes, bytes], attributes: dict[str, Any]
    ) -> Iterator[Any]:
        """The span of one request (a server span), the child of the client's trace when
        its headers carry one; yields the span (None when tracing is off)."""
        if self._tracer is None:
            yield None
            return
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers.items()}
        with self._tracer.start_as_current_span(
            name, context=extract(carrier), kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            yield span

    def span(
        self, name: str, links: list[Any] | None = None, **attributes: Any
    ) -> contextlib.AbstractContextManager[Any]:
        """A stage of the current request, timed around the block; `links`: the span
        contexts (`here`) of other requests' traces it also serves. Off, one shared
        context that does nothing (a request passes five of them)."""
        if self._tracer is None:
            return _OFF
        return self._span(name, links, attributes)

    @contextlib.contextmanager
    def _span(
        self, name: str, links: list[Any] | None, attributes: dict[str, Any]
    ) -> Iterator[Any]:
        from opentelemetry.trace import Link

        with self._tracer.start_as_current_span(
            _NAMESPACE + name,
            attributes=_attributes(attributes),
            links=[Link(c) for c in links or () if c is not None],
        ) as span:
            yield span

    def here(self) -> Any:
        """The current span's context, to link to from a span of another trace (None when
        nothing is traced)."""
        if self._tracer is None:
            return None
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        return context if context.is_valid else None

    def recording(self) -> bool:
        """Whether the current request is traced (a worker is then asked for its stages)."""
        if self._tracer is None:
            return False
        from opentelemetry import trace

        return bool(trace.get_current_span().is_recording())

    def stages(self, stages: list[Stage]) -> None:
        """Stages timed elsewhere (a worker's), as children of the current span."""
        if self._tracer is None or not stages:
            return
        for name, start, end, attributes in stages:
            span = self._tracer.start_span(
                _NAMESPACE + name, start_time=start, attributes=_attributes(attributes)
            )
            span.end(end_time=end)


class BatchStages:
    """A worker's stages of one batch, for the requests of it that are traced: the batch
    from its start until its answers are made, and each model's stages (RunReport's)."""

    def __init__(self, requests: int) -> None:
        self.start = time.time_ns()
        self.requests = requests
        self.runs: list[Stage] = []

    def add(self, model: str, stages: list[Stage]) -> None:
        self.runs.extend((n, a, b, {**attrs, "model": model}) for n, a, b, attrs in stages)

    def of(self, arrived_ns: int | None = None) -> list[Stage]:
        """One request's stages, ending now: its wait in the worker's own queue (where
        the worker keeps one: `arrived_ns`), the batch's runs, the batch whole last."""
        queue: list[Stage] = [("worker.queue", arrived_ns, self.start, {})] if arrived_ns else []
        whole = ("batch", self.start, time.time_ns(), {"requests": self.requests})
        return [*queue, *self.runs, whole]


def parse_stages(given: Any, **attributes: Any) -> list[Stage]:
    """A worker's stages as its answer carries them, `[name, start_ns, end_ns, attrs]`
    each (JSON), with `attributes` added; what is not of that shape is left out (a trace
    is never worth a request)."""
    out: list[Stage] = []
    for s in given if isinstance(given, list) else ():
        if not isinstance(s, (list, tuple)) or len(s) != 4:
            continue
        name, start, end, attrs = s
        typed = isinstance(start, int) and isinstance(end, int) and isinstance(attrs, dict)
        if isinstance(name, str) and typed:
            out.append((name, start, end, {**attrs, **attributes}))
    return out


def settings(
    endpoint: str | None, protocol: str | None, service_name: str | None
) -> tuple[str | None, str, str]:
    """(endpoint, protocol, service name): each as given, else from OpenTelemetry's
    variables (the traces' own before the general one), else the defaults (no endpoint,
    grpc, neuronserve). An endpoint from the general OTEL_EXPORTER_OTLP_ENDPOINT is a
    base URL: over http/protobuf the SDK's /v1/traces is added to it, as the SDK does."""
    env = os.environ
    protocol = (
        protocol
        or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    )
    if protocol not in PROTOCOLS:
        raise TracingUnavailable(f"OTLP protocol {protocol!r}: use {' or '.join(PROTOCOLS)}")
    if endpoint is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or None
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if endpoint is None and base:
            endpoint = base.rstrip("/") + ("/v1/traces" if protocol != "grpc" else "")
    return endpoint, protocol, service_name or env.get("OTEL_SERVICE_NAME") or "neuronserve"


def _otlp(endpoint: str, protocol: str) -> SpanExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=endpoint)


def _attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {_NAMESPACE + k: v for k, v in attributes.items() if v is not None}


_OFF = contextlib.nullcontext()

# the front's one tracer (started by the front's process when its spec asks)
TRACING = Tracing()
