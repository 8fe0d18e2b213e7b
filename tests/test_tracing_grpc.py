"""The lean server span (services/common/tracing_grpc.py) against the package's own aio server
interceptor: real grpc.aio servers and channels, the same calls, spans from the SDK's in-memory
exporter. Name, kind, scope, resource, parent, sampling and attributes (with the SDK's limits)
must be the package's; the span is the current span inside the call, so child spans and the
stored traceparent continue it; the status of a refused call is the code it was answered with,
and its span has ended when the caller holds the answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as package_encode_spans
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, StatusCode

from services.common import otlp, tracing_grpc

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
_serving: TracerProvider | None = None  # the provider of the server the test calls
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


class Refused(Exception):
    """What the echo handler answers with, as awooop handlers raise ServiceError."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status_pb2.Status(code=code, message=message)


async def _echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    if request == b"context":  # the current span's context, as the stored traceparent says it
        sc = trace.get_current_span().get_span_context()
        return f"{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}".encode()
    if request == b"child":
        assert _serving is not None
        with _serving.get_tracer("test").start_as_current_span("child"):
            return request
    if request == b"refuse":
        raise Refused(code_pb2.INVALID_ARGUMENT, "no such thing")
    if request == b"fail":
        raise Refused(code_pb2.INTERNAL, "boom")
    return request


def _answered(spans: tracing_grpc.MethodSpans | None) -> Any:
    """_echo served as the service interceptor serves a method: inside its server span (lean),
    which ends with the code answered before the status is sent."""

    async def handle(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        md = {k: v for k, v in (context.invocation_metadata() or ())}
        call_span = spans.start(context, md) if spans is not None else None
        refused = None
        try:
            return await _echo(request, context)
        except Refused as exc:
            refused = exc
        finally:
            if call_span is not None:
                code = grpc.StatusCode.OK
                if refused is not None:
                    code = next(c for c in grpc.StatusCode if c.value[0] == refused.status.code)
                call_span.end(code, refused.status.message if refused else None)
        await context.abort_with_status(rpc_status.to_status(refused.status))
        raise AssertionError("abort_with_status returned")

    return handle


def _handler(spans: tracing_grpc.MethodSpans | None) -> grpc.GenericRpcHandler:
    say = grpc.unary_unary_rpc_method_handler(_answered(spans))
    return grpc.method_handlers_generic_handler("test.Echo", {"Say": say})


Traced = tuple[Callable[[bytes, tuple[tuple[str, str], ...]], Awaitable[Any]], InMemorySpanExporter]


async def _serve(lean: bool, sampler: Sampler | None = None) -> AsyncIterator[Traced]:
    """The package's interceptor on the server, or (lean) the handler served inside the span the
    service interceptor starts for each call."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "echo"}), sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    global _serving
    _serving = provider  # the handler's own spans (b"child") come from the same provider
    if lean:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (_handler(tracing_grpc.server_interceptor(provider).spans_of("/test.Echo/Say")),)
        )
    else:
        server = grpc.aio.server(interceptors=[aio_server_interceptor(tracer_provider=provider)])
        server.add_generic_rpc_handlers((_handler(None),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    say = channel.unary_unary("/test.Echo/Say")

    async def call(body: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> Any:
        try:
            return await say(body, metadata=metadata, timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()

    try:
        yield call, memory
    finally:
        await channel.close()
        await server.stop(None)


@pytest.fixture
async def package() -> AsyncIterator[Traced]:
    async for t in _serve(lean=False):
        yield t


@pytest.fixture
async def lean() -> AsyncIterator[Traced]:
    async for t in _serve(lean=True):
        yield t


def _one(memory: InMemorySpanExporter) -> ReadableSpan:
    spans = memory.get_finished_spans()
    assert len(spans) == 1, spans
    memory.clear()
    return spans[0]


def _shape(span: ReadableSpan) -> dict[str, Any]:
    attrs = dict(span.attributes or {})
    assert attrs.pop("net.peer.port").isdigit()  # each server's own client connection
    assert span.context is not None and span.start_time is not None and span.end_time is not None
    assert span.start_time <= span.end_time
    return {
        "name": span.name,
        "kind": span.kind,
        "scope": (
            (span.instrumentation_scope.name, span.instrumentation_scope.version, span.instrumentation_scope.schema_url)
            if span.instrumentation_scope
            else None
        ),
        "resource": dict(span.resource.attributes),
        "parent": (format(span.parent.trace_id, "032x"), span.parent.is_remote) if span.parent else None,
        "trace_id": format(span.context.trace_id, "032x") if span.parent else "new",
        "flags": int(span.context.trace_flags),
        "remote": span.context.is_remote,
        "status": span.status.status_code,
        "attributes": attrs,
        "dropped": span.dropped_attributes,
        "events": span.events,
        "links": span.links,
    }


async def test_a_served_call_has_the_packages_span_with_and_without_a_traceparent(
    package: Traced, lean: Traced
) -> None:
    for metadata in ((), (("traceparent", PARENT),), (("traceparent", PARENT), ("baggage", "k=v"))):
        shapes = []
        for call, memory in (package, lean):
            assert await call(b"hi", metadata) == b"hi"
            shapes.append(_shape(_one(memory)))
        assert shapes[0] == shapes[1]
        assert shapes[1]["kind"] is SpanKind.SERVER and shapes[1]["name"] == "/test.Echo/Say"
        assert shapes[1]["attributes"]["rpc.grpc.status_code"] == 0
        if metadata:
            assert shapes[1]["parent"] == (TRACE_ID, True)
        else:
            assert shapes[1]["parent"] is None


async def test_a_refused_call_s_span_has_ended_with_its_code_when_the_caller_holds_the_answer(lean: Traced) -> None:
    call, memory = lean
    assert await call(b"refuse") == grpc.StatusCode.INVALID_ARGUMENT
    span = _one(memory)
    assert (
        span.attributes is not None
        and span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    )
    assert span.status.status_code is StatusCode.UNSET  # a client's mistake is not the server's error
    assert not span.events  # answered, not an exception

    assert await call(b"fail") == grpc.StatusCode.INTERNAL
    span = _one(memory)
    assert span.attributes is not None and span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INTERNAL.value[0]
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "StatusCode.INTERNAL:boom"


async def test_spans_of_many_concurrent_calls_each_end_once_with_their_own_parent(lean: Traced) -> None:
    import asyncio

    call, memory = lean
    parents = [f"00-{i:032x}-{i:016x}-01" for i in range(1, 41)]
    answers = await asyncio.gather(*(call(str(i).encode(), (("traceparent", p),)) for i, p in enumerate(parents)))
    assert answers == [str(i).encode() for i in range(40)]
    spans = memory.get_finished_spans()
    assert sorted(s.parent.trace_id for s in spans if s.parent) == list(range(1, 41))
    assert len({s.context.span_id for s in spans if s.context}) == 40


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("ipv4:127.0.0.1:57284", {"net.peer.ip": "127.0.0.1", "net.peer.port": "57284", "net.peer.name": "localhost"}),
        ("ipv6:[::1]:57284", {"net.peer.ip": "[::1]", "net.peer.port": "57284", "net.peer.name": "localhost"}),
        ("ipv4:10.2.1.1:5,127.0.0.1:6", {"net.peer.ip": "10.2.1.1", "net.peer.port": "5"}),
        ("ipv6:%5B2001:db8::1%5D:443", {"net.peer.ip": "[2001:db8::1]", "net.peer.port": "443"}),
        ("unix:/run/awooop.sock", {}),
        ("nonsense", {}),
    ],
)
def test_peer_attributes_are_the_packages(peer: str, expected: dict[str, str]) -> None:
    assert tracing_grpc.peer_attributes(peer) == expected


async def test_child_spans_and_the_current_context_inside_a_call_continue_its_span(lean: Traced) -> None:
    call, memory = lean
    assert await call(b"child", (("traceparent", PARENT),)) == b"child"
    server, child = sorted(memory.get_finished_spans(), key=lambda s: s.name)
    memory.clear()
    assert server.name == "/test.Echo/Say" and child.name == "child"
    assert server.context is not None and child.parent is not None and child.context is not None
    assert (child.parent.trace_id, child.parent.span_id) == (server.context.trace_id, server.context.span_id)
    assert child.context.trace_id == int(TRACE_ID, 16)

    traceparent = (await call(b"context")).decode()
    (span,) = memory.get_finished_spans()
    assert span.context is not None
    sc = span.context
    assert traceparent == f"{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}" and sc.trace_flags.sampled


async def _sampled(sampler: Sampler, metadata: tuple[tuple[str, str], ...]) -> tuple[list[str], list[int]]:
    """What the package and the lean span record of one call under `sampler`: the current span's
    context inside each call, and the trace flags of each exported span."""
    seen, flags = [], []
    for lean in (False, True):
        async for call, memory in _serve(lean, sampler):
            seen.append((await call(b"context", metadata)).decode())
            flags.append([int(s.context.trace_flags) for s in memory.get_finished_spans() if s.context])
    assert flags[0] == flags[1]
    return seen, flags[1]


async def test_the_provider_s_sampler_decides_as_for_the_package_s_span() -> None:
    def sampled(traceparent: str) -> bool:
        return bool(int(traceparent[-2:], 16) & 1)

    # nothing sampled: no span recorded, but the call's context is valid and says "not sampled"
    (package, lean), exported = await _sampled(ALWAYS_OFF, ())
    assert exported == [] and package[-2:] == lean[-2:]
    assert not sampled(lean) and not lean.startswith("0" * 32)

    # parent-based: a sampled caller's trace is recorded, an unsampled one's is not
    (package, lean), exported = await _sampled(ParentBased(ALWAYS_OFF), (("traceparent", PARENT),))
    assert exported == [1] and package.startswith(TRACE_ID) and lean.startswith(TRACE_ID) and sampled(lean)
    unsampled = PARENT[:-2] + "00"
    (package, lean), exported = await _sampled(ParentBased(ALWAYS_OFF), (("traceparent", unsampled),))
    assert exported == [] and lean.startswith(TRACE_ID) and package[-2:] == lean[-2:] and not sampled(lean)


RATIO = TraceIdRatioBased(0.5)


@pytest.mark.parametrize(
    ("sampler", "asked"),
    [
        (ALWAYS_ON, ()),
        (ALWAYS_OFF, ()),
        (DEFAULT_ON, ()),
        (ParentBased(ALWAYS_ON, remote_parent_sampled=ALWAYS_OFF, remote_parent_not_sampled=ALWAYS_ON), ()),
        (ParentBased(RATIO), (0,)),
        (RATIO, (0, 1, 2, 3, 4)),
    ],
    ids=["always_on", "always_off", "parentbased_always_on", "parentbased_inverted", "parentbased_ratio", "ratio"],
)
async def test_every_sampler_decides_for_every_parent_as_for_the_package_s_span(
    sampler: Sampler, asked: tuple[int, ...]
) -> None:
    # the SDK's static samplers are answered without being asked (tracing_grpc.fixed_decisions);
    # the others are asked. Either way: the package's decision, flags and trace state.
    decisions = tracing_grpc.fixed_decisions(sampler)
    assert [i for i, d in enumerate(decisions) if d is None] == list(asked)
    state = ("tracestate", "vendor=v1,other=x")
    callers: list[tuple[tuple[str, str], ...]] = [(("traceparent", PARENT), state)]
    callers.append((("traceparent", PARENT[:-2] + "00"), state))
    if 0 not in asked:  # a new trace's ratio decision depends on its random id, unlike the package's
        callers.append(())
    for metadata in callers:
        seen = []
        for lean in (False, True):
            async for call, memory in _serve(lean, sampler):
                inside = (await call(b"context", metadata)).decode()
                exported = [
                    (s.context.trace_flags, s.context.trace_state) for s in memory.get_finished_spans() if s.context
                ]
                seen.append((inside.split("-")[0] if metadata else "", inside[-2:], exported))
        assert seen[0] == seen[1], metadata


async def test_the_sdk_s_attribute_limits_apply_as_to_the_package_s_span(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "5")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "6")
    shapes = []
    for lean in (False, True):
        async for call, memory in _serve(lean):
            assert await call(b"hi", (("user-agent", "a-long-agent"),)) == b"hi"
            span = _one(memory)
            attrs = dict(span.attributes or {})
            assert attrs.pop("net.peer.port").isdigit()  # each server's own client connection
            shapes.append((attrs, span.dropped_attributes))
    assert shapes[0] == shapes[1]
    assert shapes[1][1] > 0 and all(len(v) <= 5 for v in shapes[1][0].values() if isinstance(v, str))


def test_an_unhandled_exception_s_event_is_the_sdk_s_record_exception() -> None:
    from opentelemetry.sdk.trace import SpanLimits

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    try:
        {}["missing"]
    except KeyError as exc:
        with provider.get_tracer("test").start_as_current_span("sdk", record_exception=False) as span:
            span.record_exception(exc)
        lean = tracing_grpc.exception_event(exc, SpanLimits())
    (sdk,) = memory.get_finished_spans()[0].events
    assert (lean.name, dict(lean.attributes or {})) == (sdk.name, dict(sdk.attributes or {}))


async def test_the_spans_of_a_connection_encode_as_the_package_encodes_them() -> None:
    # the server spans of one connection share their attributes, which the OTLP encoder encodes
    # once (otlp.SharedAttributes); a refused call's span has attributes of its own
    async for call, memory in _serve(lean=True):
        for body in (b"hi", b"refuse", b"hi", b"fail", b"hi"):
            await call(body, (("user-agent", "agent/1"),))
        spans = list(memory.get_finished_spans())
    assert [type(s._attributes).__name__ for s in spans] == [
        "SharedAttributes",
        "BoundedAttributes",
        "SharedAttributes",
        "BoundedAttributes",
        "SharedAttributes",
    ]
    assert spans[0]._attributes is spans[2]._attributes
    for _ in range(2):  # the second time from the kept encoding
        assert otlp.encode_spans(spans).SerializeToString() == package_encode_spans(spans).SerializeToString()
