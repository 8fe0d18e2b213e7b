"""OpenTelemetry tracing of the services: off unless configured, then one trace per run.

Configuration is the standard OTEL_* variables: tracing is on when OTEL_TRACES_EXPORTER is
`otlp` or `console`, or an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT /
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), and OTEL_SDK_DISABLED is not true. The OTLP exporter then
reads its own variables (endpoint, headers, timeout, certificate), the sampler
OTEL_TRACES_SAMPLER(_ARG), the resource OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES.

Everything is the maintained packages' public API: the server spans are
opentelemetry-instrumentation-grpc's aio server interceptor (`server_interceptors`, health and
reflection left out), the client spans its aio client interceptors, the export the SDK's
BatchSpanProcessor with opentelemetry-exporter-otlp-proto-grpc's OTLPSpanExporter.

Off costs nothing: no interceptor is installed (a server's interceptors are chosen when it is
built, so configure tracing before) and every helper here returns at its first test of `tracer`
(module global, None while off).

The run's trace: the span that created the run (IngestEvent / CreateRun server span, a
child of the caller's W3C `traceparent` metadata, or a new trace) is stored with the run
(awooop_run_state.traceparent) and handed to the worker with its claim
(ClaimedRun.traceparent, claimable_since), so the worker SDK's claim, run and step spans, and
the saga RPCs they make, continue it; the saga's compensation and its gateway calls are spans of the
same trace, read back from the run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.common.public_methods import is_public

PROPAGATOR = TraceContextTextMapPropagator()
SCOPE = "awooop"

provider: Any = None  # the TracerProvider in use (None: tracing off)
tracer: trace.Tracer | None = None
_owned = False  # configured from the environment here (so shut down here)


def env_enabled(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter in ("otlp", "console")
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(tracer_provider: Any) -> None:
    """Uses tracer_provider for every span of this process's services (None: tracing off).
    Tests pass an SDK TracerProvider with an in-memory exporter."""
    global provider, tracer, _owned
    provider = tracer_provider
    tracer = tracer_provider.get_tracer(SCOPE) if tracer_provider is not None else None
    _owned = False


def configure_from_env(default_service_name: str) -> bool:
    """At start-up: when the OTEL_* variables turn tracing on (and nothing configured it yet),
    an SDK TracerProvider with a batching exporter. True when tracing is on."""
    global _owned
    if tracer is not None:
        return True
    if not env_enabled():
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # endpoint, headers, TLS, timeout: OTEL_EXPORTER_OTLP_*
    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES (read by Resource.create) name the service;
    # without them the SDK says unknown_service, and the default here names it instead
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": default_service_name}))
    tp = TracerProvider(resource=resource)  # its sampler: OTEL_TRACES_SAMPLER(_ARG)
    tp.add_span_processor(BatchSpanProcessor(exporter))
    configure(tp)
    _owned = True
    return True


def exporter_name() -> str:
    """What the spans go to, for the start-up log line."""
    if not _owned:
        return "configured by the application"
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        return "console"
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return f"otlp {endpoint or 'localhost:4317'}"


def shutdown() -> None:
    """Flushes and stops a provider configured from the environment (at process exit)."""
    if _owned and provider is not None:
        provider.shutdown()
        configure(None)


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The server interceptor that gives each served call its span (none while off):
    opentelemetry-instrumentation-grpc's, first in a server's list so that the service
    interceptor, its access log and the handler run inside the span. Health and reflection, which
    the service interceptor leaves untouched too, get none (a probe every few seconds would
    otherwise be much of the trace volume)."""
    if provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    def traced(details: grpc.HandlerCallDetails) -> bool:
        return not is_public(details.method)

    return [aio_server_interceptor(tracer_provider=provider, filter_=traced)]  # type: ignore[no-untyped-call]


def record_exception(exc: BaseException) -> None:
    """Records an exception nothing answered (a bug, answered INTERNAL) on the current span:
    the server span of the call (the interceptor records only what escapes the handler)."""
    if tracer is not None:
        trace.get_current_span().record_exception(exc)


def client_interceptors() -> list[Any]:
    """Client interceptors that send the current span as `traceparent` (none while off)."""
    if provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors(tracer_provider=provider))  # type: ignore[no-untyped-call]


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span (None: tracing off or no valid span)."""
    if tracer is None:
        return None
    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    # what PROPAGATOR.inject writes as `traceparent`, without its carrier and setter per call
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"


def _context(traceparent: str | None) -> Any:
    return PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None


@contextlib.contextmanager
def span(
    name: str,
    *,
    parent: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    link_current: bool = False,
    start_time: int | None = None,
) -> Iterator[trace.Span | None]:
    """A span of the run whose stored traceparent is `parent` (None: a child of the current
    span), current inside the block; link_current also links the span that is current now (the
    RPC that caused it, in the caller's own trace). Yields None while tracing is off."""
    if tracer is None:
        yield None
        return
    links: Sequence[trace.Link] = ()
    if link_current:
        here = trace.get_current_span().get_span_context()
        links = (trace.Link(here),) if here.is_valid else ()
    with tracer.start_as_current_span(
        name,
        context=_context(parent),
        attributes=dict(attributes or {}),
        links=links,
        start_time=start_time,
    ) as s:
        yield s


def log_fields() -> dict[str, str]:
    """trace_id and span_id of the current span, for log lines (empty while off)."""
    if tracer is None:
        return {}
    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return {}
    return {"trace_id": format(sc.trace_id, "032x"), "span_id": format(sc.span_id, "016x")}
