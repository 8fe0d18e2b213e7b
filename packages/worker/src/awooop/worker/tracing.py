"""OpenTelemetry in the worker SDK: a claimed run's handler runs in a span of the run's trace
(ClaimedRun.traceparent, from the scheduler), after a span of the claim covering the queue wait
(from ClaimedRun.claimable_since); each journaled step is a child span, and the SDK's calls
carry the current span as W3C `traceparent` metadata, so the saga's spans join too.

Off unless the application gives a TracerProvider (Worker(tracer_provider=...)) or installed
one globally (opentelemetry.trace.set_tracer_provider); off, nothing is added to a call.
OpenTelemetry is the `tracing` extra of awooop-worker: without it tracing is off, and a
tracer_provider given anyway is refused (a worker that silently traced nothing would mislead).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # awooop-worker without its `tracing` extra
    trace = None  # type: ignore[assignment]

SCOPE = "awooop.worker"
_PROPAGATOR = TraceContextTextMapPropagator() if trace is not None else None
MISSING = "tracer_provider given, but OpenTelemetry is not installed: pip install 'awooop-worker[tracing]'"


def resolve(tracer_provider: Any) -> Any:
    """tracer_provider, else the global one when the application set one, else None (off)."""
    if trace is None:
        if tracer_provider is not None:
            raise ValueError(MISSING)
        return None
    if tracer_provider is not None:
        return tracer_provider
    current = trace.get_tracer_provider()
    return None if isinstance(current, trace.ProxyTracerProvider | trace.NoOpTracerProvider) else current


def client_interceptors(tracer_provider: Any) -> list[Any]:
    if tracer_provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors(tracer_provider=tracer_provider))  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def span(
    tracer: trace.Tracer | None,
    name: str,
    *,
    traceparent: str = "",
    attributes: Mapping[str, Any] | None = None,
    kind: str = "INTERNAL",
    claimed_since_ns: int = 0,
) -> Iterator[trace.Span | None]:
    """A span current inside the block: a child of traceparent when given, else of the current
    span; kind names a trace.SpanKind. claimed_since_ns: first record the claim as a span of that
    trace from then (the run became claimable) to now, and make the new span its child. Yields
    None when tracing is off."""
    if tracer is None:
        yield None
        return
    assert trace is not None and _PROPAGATOR is not None  # a tracer exists only when OpenTelemetry does
    parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
    if parent is not None and claimed_since_ns:
        claim = tracer.start_span("awooop.run.claim", context=parent, start_time=claimed_since_ns)
        claim.end()
        parent = trace.set_span_in_context(claim)
    span_kind = trace.SpanKind[kind]
    with tracer.start_as_current_span(name, context=parent, kind=span_kind, attributes=dict(attributes or {})) as s:
        yield s
