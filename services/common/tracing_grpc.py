"""The server span of every traced RPC: opentelemetry-instrumentation-grpc's aio server
interceptor's span (its tracer, name, kind, parent and attributes; tests compare them with the
package's own), recorded at a fraction of the cost.

The package's interceptor builds, for every call, a new method handler and two closures, an
ObjectProxy (wrapt) around the servicer context, a metadata dict twice, the extracted context
(even without a `traceparent`), the peer split three times, and three nested context managers
around the span. Here that work is done once per method, once per connection, or only when
needed (docs/benchmarks.md, "Tracing cost").

The span itself is recorded without the SDK's mutable `Span`: under load its construction
(locks, bounded containers, each attribute validated again on every call) and the readable copy
made at `end` cost a saturated ingest process about a fifth of its IngestEvent rate, where the
budget is 15% for tracing as a whole. A call's span is instead decided by the provider's own
sampler (the SDK's static ones, which decide by the parent alone, answered as they would
answer, without their ~40 Python calls a span), identified by its id generator, current during
the call as a `NonRecordingSpan` of its SpanContext (what child spans and the stored
`traceparent` need), and handed at its end to the provider's span processors as the SDK's
`ReadableSpan`, with attributes validated and truncated by the SDK's `BoundedAttributes` under
the `OTEL_*` span limits once per connection.
What differs from an SDK span: span processors see only its end (`on_end`, not `on_start`),
and code inside a call cannot add attributes or events to it (none here does; the services'
own spans, such as a journaled step's, are SDK spans).

The service interceptor starts the span (`MethodSpans.start`) and ends it (`ServerSpan.end`)
itself, with the code it answers: every awooop failure is answered with `abort_with_status`,
which sends the status before it raises, so a span ended after that could still be open when
the caller already holds the answer (and the package's context proxy never sees that status: its
span said status 0 and carried the AbortError twice as an exception event). Here the span ends
first, with `rpc.grpc.status_code` and the error status the package's `_server_status` gives
the code, and records as an exception only an unhandled one (answered INTERNAL), as the SDK's
`record_exception` does.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.instrumentation.grpc._aio_server import OpenTelemetryAioServerInterceptor
from opentelemetry.instrumentation.grpc._utilities import _server_status
from opentelemetry.instrumentation.grpc.version import __version__
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.trace import Tracer as SDKTracer
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, StaticSampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv._incubating.attributes.net_attributes import NET_PEER_IP, NET_PEER_NAME, NET_PEER_PORT
from opentelemetry.semconv._incubating.attributes.rpc_attributes import (
    RPC_GRPC_STATUS_CODE,
    RPC_METHOD,
    RPC_SERVICE,
    RPC_SYSTEM,
)
from opentelemetry.semconv.attributes.exception_attributes import (
    EXCEPTION_ESCAPED,
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from services.common.otlp import SharedAttributes

_PEERS_KEPT = 4096  # (peer, user agent) pairs whose attributes a method keeps (a client's ports are few)
_SERVER = trace.SpanKind.SERVER
_SCOPE = ("opentelemetry.instrumentation.grpc", __version__, "https://opentelemetry.io/schemas/1.11.0")
_UNSET = Status(StatusCode.UNSET)


def server_interceptor(provider: Any) -> LeanAioServerInterceptor:
    """What the package's `aio_server_interceptor(tracer_provider=provider)` returns, lean: the
    same tracer (the package's name, version and schema) of an SDK TracerProvider."""
    name, version, schema_url = _SCOPE
    tracer = trace.get_tracer(name, version, provider, schema_url=schema_url)
    if not isinstance(tracer, SDKTracer):
        raise TypeError(f"server spans are recorded through the OpenTelemetry SDK's TracerProvider, not {provider!r}")
    return LeanAioServerInterceptor(tracer)  # type: ignore[no-untyped-call]  # the package's __init__


_textmap_fields: tuple[Any, frozenset[str]] = (None, frozenset())


def _fields(textmap: Any) -> frozenset[str]:
    """The carrier keys the global propagator reads (a composite one builds the set per call)."""
    global _textmap_fields
    if _textmap_fields[0] is not textmap:
        _textmap_fields = (textmap, frozenset(textmap.fields))
    return _textmap_fields[1]


def peer_attributes(peer: str) -> dict[str, str]:
    """The net.peer.* attributes the package derives from `context.peer()`."""
    if peer.startswith("unix:"):
        return {}
    try:
        ip, port = peer.split(",")[0].split(":", 1)[1].rsplit(":", 1)
    except (IndexError, ValueError):
        return {}  # the package logs a warning and leaves them out
    ip = unquote(ip)
    attrs = {NET_PEER_IP: ip, NET_PEER_PORT: port}
    if ip in ("[::1]", "127.0.0.1"):
        attrs[NET_PEER_NAME] = "localhost"
    return attrs


def exception_event(exc: BaseException, limits: SpanLimits) -> Event:
    """The event the SDK's `Span.record_exception(exc)` adds."""
    module, qualname = type(exc).__module__, type(exc).__qualname__
    attributes = {
        EXCEPTION_TYPE: f"{module}.{qualname}" if module and module != "builtins" else qualname,
        EXCEPTION_MESSAGE: str(exc),
        EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exc)),
        EXCEPTION_ESCAPED: str(False),
    }
    bounded = BoundedAttributes(
        limits.max_event_attributes, attributes, immutable=True, max_value_len=limits.max_attribute_length
    )
    return Event("exception", bounded)


# ParentBased's delegates, in fixed_decisions' order: root, remote (not) sampled, local (not) sampled
_PARENT_BASED_DELEGATES = (
    "_root",
    "_remote_parent_sampled",
    "_remote_parent_not_sampled",
    "_local_parent_sampled",
    "_local_parent_not_sampled",
)


def fixed_decisions(sampler: Sampler) -> tuple[Decision | None, ...]:
    """What `sampler` decides without being asked, by the parent: (none, remote sampled, remote
    not sampled, local sampled, local not sampled); None where it must be asked. The SDK's
    static samplers (always_on, always_off, and the parent-based ones' delegates by default)
    decide by the parent alone, keep the attributes, and take the parent's trace state. Their
    fields are the SDK's private ones: should a later SDK rename them, every sampler is asked
    and only the speed is lost."""

    def static(s: object) -> Decision | None:
        return getattr(s, "_decision", None) if type(s) is StaticSampler else None

    if type(sampler) is ParentBased:
        return tuple(static(getattr(sampler, name, None)) for name in _PARENT_BASED_DELEGATES)
    return (static(sampler),) * 5


class LeanAioServerInterceptor(OpenTelemetryAioServerInterceptor):
    """The package's interceptor, its tracer and span; served through `spans_of(method)`, which
    the service interceptor asks once per method (no interceptor layer per call)."""

    def spans_of(self, method: str) -> MethodSpans:
        return MethodSpans(self._tracer, method)


class MethodSpans:
    """Starts the server spans of one method's calls."""

    __slots__ = ("_base", "_decisions", "_known", "_limits", "_method", "_scope", "_tracer")

    def __init__(self, tracer: SDKTracer, method: str) -> None:
        self._tracer = tracer
        self._method = method
        self._decisions = fixed_decisions(tracer.sampler)
        self._scope = InstrumentationScope(*_SCOPE)
        # the limits the SDK's spans apply (OTEL_SPAN_ATTRIBUTE_*, OTEL_ATTRIBUTE_*)
        self._limits = SpanLimits()
        service, name = method.lstrip("/").split("/", 1)
        self._base = {
            RPC_SYSTEM: "grpc",
            RPC_GRPC_STATUS_CODE: grpc.StatusCode.OK.value[0],
            RPC_METHOD: name,
            RPC_SERVICE: service,
        }
        # (peer, user agent) -> the span's attributes, validated as the SDK's span does: the same
        # for every call of a connection
        self._known: dict[tuple[str, str | None], BoundedAttributes] = {}

    def _bounded(
        self, attrs: Mapping[str, Any], kind: type[BoundedAttributes] = BoundedAttributes
    ) -> BoundedAttributes:
        limits = self._limits
        return kind(limits.max_span_attributes, attrs, immutable=True, max_value_len=limits.max_span_attribute_length)

    def _attributes(self, peer: str, agent: str | None) -> BoundedAttributes:
        attrs = self._known.get((peer, agent))
        if attrs is None:
            if len(self._known) >= _PEERS_KEPT:
                self._known.clear()
            raw: dict[str, Any] = dict(self._base)
            if agent is not None:
                raw["rpc.user_agent"] = agent
            raw.update(peer_attributes(peer))
            attrs = self._known[peer, agent] = self._bounded(raw, SharedAttributes)
        return attrs

    def start(self, context: Any, metadata: Mapping[str, str | bytes]) -> ServerSpan:
        """The call's span, current until it ends (without the package's per-call suppression
        check: no served call runs in a context that suppresses instrumentation). `metadata` is
        the call's invocation metadata as a dict (the last value of a repeated key wins, as in
        the package's), which the service interceptor builds once for this and its auth."""
        parent_token = None
        # extracting from a carrier without the propagator's fields gives the current context back
        if metadata:
            textmap = propagate.get_global_textmap()
            if not _fields(textmap).isdisjoint(metadata):
                parent_token = otel_context.attach(textmap.extract(metadata))
        agent = metadata.get("user-agent")
        attributes = self._attributes(context.peer(), agent if isinstance(agent, str) else None)
        # what the SDK's Tracer.start_span decides, in its order: parent, trace id, sampler, flags
        tracer = self._tracer
        ids = tracer.id_generator
        parent: SpanContext | None = trace.get_current_span().get_span_context()
        if parent is not None and parent.is_valid:
            trace_id = parent.trace_id
            random_id = parent.trace_flags.random_trace_id
            case = (1 if parent.is_remote else 3) + (not parent.trace_flags.sampled)
        else:
            parent = None
            trace_id = ids.generate_trace_id()
            random_id = ids.is_trace_id_random()
            case = 0
        decision = self._decisions[case]
        if decision is not None:  # what the static sampler answers, without its ~40 Python calls
            trace_state = parent.trace_state if parent is not None else None
        else:
            sampled = tracer.sampler.should_sample(None, trace_id, self._method, _SERVER, attributes, ())
            decision, trace_state = sampled.decision, sampled.trace_state
            if decision is not Decision.DROP and len(sampled.attributes) != len(attributes):
                attributes = self._bounded(sampled.attributes)  # the sampler added attributes of its own
        flags = TraceFlags.SAMPLED if decision is Decision.RECORD_AND_SAMPLE else TraceFlags.DEFAULT
        if random_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        span_context = SpanContext(
            trace_id,
            ids.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(flags),
            trace_state=trace_state,
        )
        token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(span_context)))
        if decision is Decision.DROP:
            return ServerSpan(token, parent_token)
        return RecordedServerSpan(token, parent_token, self, span_context, parent, attributes, time.time_ns())


class ServerSpan:
    """One call's span that is not recorded: the context tokens to give back when it ends."""

    __slots__ = ("_parent_token", "_token")

    def __init__(self, token: object, parent_token: object | None) -> None:
        self._token = token
        self._parent_token = parent_token

    def end(self, code: grpc.StatusCode | None, details: str | None, unhandled: BaseException | None = None) -> None:
        """Ends the span with the code the call is answered with (None or OK: the span's OK);
        `unhandled` is an exception nothing answered, recorded as the span's event."""
        otel_context.detach(self._token)  # type: ignore[arg-type]
        if self._parent_token is not None:
            otel_context.detach(self._parent_token)  # type: ignore[arg-type]


class RecordedServerSpan(ServerSpan):
    """A sampled call's span: at its end, the SDK's ReadableSpan to the provider's processors."""

    __slots__ = ("_attributes", "_context", "_method", "_parent", "_start")

    def __init__(
        self,
        token: object,
        parent_token: object | None,
        method: MethodSpans,
        span_context: SpanContext,
        parent: SpanContext | None,
        attributes: BoundedAttributes,
        start: int,
    ) -> None:
        super().__init__(token, parent_token)
        self._method = method
        self._context = span_context
        self._parent = parent
        self._attributes = attributes
        self._start = start

    def end(self, code: grpc.StatusCode | None, details: str | None, unhandled: BaseException | None = None) -> None:
        end = time.time_ns()
        super().end(code, details, unhandled)
        method = self._method
        attributes = self._attributes
        status = _UNSET
        if code is not None and code is not grpc.StatusCode.OK:
            dropped = attributes.dropped  # as the SDK's span counts those its limits left out
            attributes = method._bounded({**attributes, RPC_GRPC_STATUS_CODE: code.value[0]})
            attributes.dropped = dropped
            status = _server_status(code, details)  # type: ignore[no-untyped-call]
        tracer = method._tracer
        tracer.span_processor.on_end(
            ReadableSpan(
                name=method._method,
                context=self._context,
                parent=self._parent,
                resource=tracer.resource,
                attributes=attributes,
                events=(exception_event(unhandled, method._limits),) if unhandled is not None else (),
                kind=_SERVER,
                status=status,
                start_time=self._start,
                end_time=end,
                instrumentation_scope=method._scope,
            )
        )
