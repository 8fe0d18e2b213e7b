"""The server span of every traced RPC: opentelemetry-instrumentation-grpc's aio server
interceptor, with its per-call work cut down.

The package's interceptor builds, for every call, a new method handler and two closures, an
ObjectProxy (wrapt) around the servicer context, a metadata dict twice, the extracted context
(even without a `traceparent`), the peer split three times, and three nested context managers
around the span: about 50 µs of the ~65 µs a traced call costs here, more than the SDK's span
(docs/benchmarks.md, "Tracing cost"). This subclass keeps its tracer, filter and span (name,
kind, parent, the same attributes; tests compare them with the package's own `_start_span`)
and does that work once per method, once per connection, or only when needed.

The service interceptor starts the span (`MethodSpans.start`) and ends it (`ServerSpan.end`)
itself, with the code it answers: every awooop failure is answered with `abort_with_status`,
which sends the status before it raises, so a span ended after that could still be open when
the caller already holds the answer (and the package's context proxy never sees that status: its
span said status 0 and carried the AbortError twice as an exception event). Here the span ends
first, with `rpc.grpc.status_code` and the error status the package's `_server_status` gives
the code, and records as an exception only an unhandled one (answered INTERNAL).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.instrumentation.grpc._aio_server import OpenTelemetryAioServerInterceptor
from opentelemetry.instrumentation.grpc._utilities import _server_status
from opentelemetry.instrumentation.grpc.version import __version__
from opentelemetry.semconv._incubating.attributes.net_attributes import NET_PEER_IP, NET_PEER_NAME, NET_PEER_PORT
from opentelemetry.semconv._incubating.attributes.rpc_attributes import (
    RPC_GRPC_STATUS_CODE,
    RPC_METHOD,
    RPC_SERVICE,
    RPC_SYSTEM,
)

_PEERS_KEPT = 4096  # (peer, user agent) pairs whose attributes a method keeps (a client's ports are few)
_SERVER = trace.SpanKind.SERVER


def server_interceptor(provider: Any) -> LeanAioServerInterceptor:
    """What the package's `aio_server_interceptor(tracer_provider=provider)` returns, lean: the
    same tracer (the package's name, version and schema)."""
    tracer = trace.get_tracer(
        "opentelemetry.instrumentation.grpc",
        __version__,
        provider,
        schema_url="https://opentelemetry.io/schemas/1.11.0",
    )
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


class LeanAioServerInterceptor(OpenTelemetryAioServerInterceptor):
    """The package's interceptor, its tracer and span; served through `spans_of(method)`, which
    the service interceptor asks once per method (no interceptor layer per call)."""

    def spans_of(self, method: str) -> MethodSpans:
        return MethodSpans(self._tracer, method)


class MethodSpans:
    """Starts the server spans of one method's calls."""

    __slots__ = ("_base", "_known", "_method", "_tracer")

    def __init__(self, tracer: trace.Tracer, method: str) -> None:
        self._tracer = tracer
        self._method = method
        service, name = method.lstrip("/").split("/", 1)
        self._base = {
            RPC_SYSTEM: "grpc",
            RPC_GRPC_STATUS_CODE: grpc.StatusCode.OK.value[0],
            RPC_METHOD: name,
            RPC_SERVICE: service,
        }
        # (peer, user agent) -> the span's attributes: the same for every call of a connection,
        # and the SDK copies what it is given
        self._known: dict[tuple[str, str | None], dict[str, Any]] = {}

    def _attributes(self, peer: str, agent: str | None) -> dict[str, Any]:
        attrs = self._known.get((peer, agent))
        if attrs is None:
            if len(self._known) >= _PEERS_KEPT:
                self._known.clear()
            attrs = dict(self._base)
            if agent is not None:
                attrs["rpc.user_agent"] = agent
            attrs.update(peer_attributes(peer))
            self._known[peer, agent] = attrs
        return attrs

    def start(self, context: Any) -> ServerSpan:
        """The call's span, current until it ends (without the package's per-call suppression
        check: no served call runs in a context that suppresses instrumentation)."""
        metadata = context.invocation_metadata()
        agent = None
        token = None
        if metadata:
            textmap = propagate.get_global_textmap()
            fields = _fields(textmap)
            carried = False
            for m in metadata:  # the last value of a repeated key wins, as in the package's dicts
                key = m.key
                if key == "user-agent":
                    agent = m.value
                elif key in fields:
                    carried = True
            # extracting from a carrier without the propagator's fields gives the current context back
            if carried:
                token = otel_context.attach(textmap.extract({m.key: m.value for m in metadata}))
        span = self._tracer.start_span(
            self._method,
            kind=_SERVER,
            attributes=self._attributes(context.peer(), agent),
            set_status_on_exception=False,
        )
        return ServerSpan(span, otel_context.attach(trace.set_span_in_context(span)), token)


class ServerSpan:
    """One call's span and the context tokens to give back when it ends."""

    __slots__ = ("_parent_token", "_span", "_token")

    def __init__(self, span: trace.Span, token: object, parent_token: object | None) -> None:
        self._span = span
        self._token = token
        self._parent_token = parent_token

    def end(self, code: grpc.StatusCode | None, details: str | None, unhandled: BaseException | None = None) -> None:
        """Ends the span with the code the call is answered with (None or OK: the span's OK);
        `unhandled` is an exception nothing answered, recorded as the span's event."""
        span = self._span
        otel_context.detach(self._token)  # type: ignore[arg-type]
        if self._parent_token is not None:
            otel_context.detach(self._parent_token)  # type: ignore[arg-type]
        if unhandled is not None:
            span.record_exception(unhandled)
        if code is not None and code is not grpc.StatusCode.OK:
            span.set_attribute(RPC_GRPC_STATUS_CODE, code.value[0])
            span.set_status(_server_status(code, details))  # type: ignore[no-untyped-call]
        span.end()
