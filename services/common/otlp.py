"""The OTLP/gRPC span exporter of opentelemetry-exporter-otlp-proto-grpc, with a leaner encoding.

The package's encoder (opentelemetry-exporter-otlp-proto-common) builds every attribute, span,
scope and resource as a separate message and passes it to its parent's constructor, which copies
it (upb merges by serializing and parsing again), and hashes each span's Resource (a JSON dump of
its attributes) to group the spans. Setting the fields of one message in place instead still
cost about 22 µs a span here, in the export thread, which holds the GIL the event loop needs
(docs/benchmarks.md, "Tracing cost"). This writes the protobuf wire format of the request
directly, with the encoded form of each attribute (key and value) and span name kept once seen
(a server's spans repeat the same few), and that of a connection's shared attributes
(SharedAttributes) kept whole, and gives the exporter the message upb parses from it;
the test compares the bytes with the package's encoder. Everything else, endpoint, headers, TLS,
compression, timeout and retries from the OTEL_EXPORTER_OTLP_* variables, is the package's
exporter; should a later version stop calling `_translate_data`, its own encoder is used and
only the speed is lost.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PBSpan
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

_KIND = {
    SpanKind.INTERNAL: PBSpan.SPAN_KIND_INTERNAL,
    SpanKind.SERVER: PBSpan.SPAN_KIND_SERVER,
    SpanKind.CLIENT: PBSpan.SPAN_KIND_CLIENT,
    SpanKind.PRODUCER: PBSpan.SPAN_KIND_PRODUCER,
    SpanKind.CONSUMER: PBSpan.SPAN_KIND_CONSUMER,
}
log = logging.getLogger(__name__)
_HAS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
_DOUBLE = struct.Struct("<d").pack
_INT64 = (-(1 << 63), (1 << 63) - 1)
_KEPT = 4096  # encoded attributes and names kept; past that the memo starts over


class LeanOTLPSpanExporter(OTLPSpanExporter):
    def _translate_data(self, data: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
        return encode_spans(data)


def encode_spans(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """What opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans returns."""
    return ExportTraceServiceRequest.FromString(encode_spans_bytes(spans))


def encode_spans_bytes(spans: Sequence[ReadableSpan]) -> bytes:
    """The serialized ExportTraceServiceRequest: spans grouped by resource, then by scope, each
    group in the order it first appears (as the package's encoder groups them)."""
    groups: dict[int, tuple[Resource, dict[InstrumentationScope | None, list[bytes]]]] = {}
    for s in spans:
        resource = s.resource
        group = groups.get(id(resource))
        if group is None:
            group = groups[id(resource)] = (resource, {})
        scope_spans = group[1].get(s.instrumentation_scope)
        if scope_spans is None:
            scope_spans = group[1][s.instrumentation_scope] = []
        scope_spans.append(_span(s))
    out = []
    for resource, scopes in groups.values():
        rs = [_message(1, _attributes(1, resource.attributes))]  # ResourceSpans.resource
        for scope, encoded in scopes.items():
            ss = [_message(1, _scope(scope)), *encoded]  # ScopeSpans.scope, .spans
            if scope is not None and scope.schema_url:
                ss.append(_message(3, scope.schema_url.encode()))
            rs.append(_message(2, b"".join(ss)))
        if resource.schema_url:
            rs.append(_message(3, resource.schema_url.encode()))
        out.append(_message(1, b"".join(rs)))
    return b"".join(out)


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _message(field: int, body: bytes) -> bytes:
    """A length-delimited field (a message, string or bytes)."""
    return _varint(field << 3 | 2) + _varint(len(body)) + body


def _scope(scope: InstrumentationScope | None) -> bytes:
    if scope is None:
        return b""
    parts = []
    if scope.name:
        parts.append(_message(1, scope.name.encode()))
    if scope.version:
        parts.append(_message(2, scope.version.encode()))
    parts.append(_attributes(3, scope.attributes))
    return b"".join(parts)


_names: dict[str, bytes] = {}


def _name(name: str) -> bytes:
    encoded = _names.get(name)
    if encoded is None:
        if len(_names) >= _KEPT:
            _names.clear()
        encoded = _names[name] = _message(5, name.encode())
    return encoded


def _span(s: ReadableSpan) -> bytes:
    """The ScopeSpans.spans field of one span."""
    sc = s.get_span_context()
    assert sc is not None  # an SDK span always has its context
    parent = s.parent
    parts = [b"\x0a\x10", sc.trace_id.to_bytes(16, "big"), b"\x12\x08", sc.span_id.to_bytes(8, "big")]
    if sc.trace_state:
        parts.append(_message(3, ",".join(f"{k}={v}" for k, v in sc.trace_state.items()).encode()))
    if parent is not None:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    parts.append(_name(s.name))
    kind = _KIND[s.kind]
    if kind:
        parts.append(b"\x30" + _varint(kind))
    if s.start_time:
        parts += (b"\x39", _FIXED64(s.start_time))
    if s.end_time:
        parts += (b"\x41", _FIXED64(s.end_time))
    parts.append(_span_attributes(s))
    if s.dropped_attributes:
        parts.append(b"\x50" + _varint(s.dropped_attributes))
    for e in s.events:
        event = [b"\x09", _FIXED64(e.timestamp)] if e.timestamp else []
        if e.name:
            event.append(_message(2, e.name.encode()))
        event.append(_attributes(3, e.attributes))
        if e.dropped_attributes:
            event.append(b"\x20" + _varint(e.dropped_attributes))
        parts.append(_message(11, b"".join(event)))
    if s.dropped_events:
        parts.append(b"\x60" + _varint(s.dropped_events))
    for link in s.links:
        lc = link.context
        encoded = [b"\x0a\x10", lc.trace_id.to_bytes(16, "big"), b"\x12\x08", lc.span_id.to_bytes(8, "big")]
        encoded.append(_attributes(4, link.attributes))
        if link.dropped_attributes:
            encoded.append(b"\x28" + _varint(link.dropped_attributes))
        encoded += (b"\x35", _FIXED32(_HAS_REMOTE | (_IS_REMOTE if lc.is_remote else 0)))
        parts.append(_message(13, b"".join(encoded)))
    if s.dropped_links:
        parts.append(b"\x70" + _varint(s.dropped_links))
    status = s.status
    if status is not None:  # present even when UNSET, as the package sends it
        body = _message(2, status.description.encode()) if status.description else b""
        if status.status_code.value:
            body += b"\x18" + _varint(status.status_code.value)
        parts.append(_message(15, body))
    parts += (b"\x85\x01", _FIXED32(_HAS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)))
    return _message(2, b"".join(parts))


class SharedAttributes(BoundedAttributes):
    """Immutable attributes that many spans share (the server spans of one connection,
    tracing_grpc.MethodSpans), which the encoder encodes once."""


_blocks: dict[int, tuple[SharedAttributes, bytes]] = {}


def _span_attributes(s: ReadableSpan) -> bytes:
    """The span's attributes field: a SharedAttributes' encoding is kept with it (so its id is
    not reused while the encoding is)."""
    attrs = getattr(s, "_attributes", None)
    if type(attrs) is not SharedAttributes:
        return _attributes(9, _plain(s))
    block = _blocks.get(id(attrs))
    if block is None or block[0] is not attrs:
        if len(_blocks) >= _KEPT:
            _blocks.clear()
        block = _blocks[id(attrs)] = (attrs, _attributes(9, attrs._dict))
    return block[1]


def _plain(s: ReadableSpan) -> Mapping[str, Any] | None:
    """The span's attributes: the dict inside the SDK's BoundedAttributes when it has one (the
    public read-only view iterates through the Mapping ABC, 1 µs more a span), else the view."""
    inner = getattr(getattr(s, "_attributes", None), "_dict", None)
    return inner if type(inner) is dict else s.attributes


_encoded: dict[tuple[int, str, type, Any], bytes] = {}


def _attributes(field: int, attributes: Mapping[str, Any] | None) -> bytes:
    """The repeated KeyValue `field` of a message (as the package: one that cannot be encoded is
    left out and logged)."""
    if not attributes:
        return b""
    parts = []
    for key, value in attributes.items():
        kind = type(value)
        memo = kind in (str, int, bool, float)  # the memo's key tells True from 1 and 1.0
        if memo:
            encoded = _encoded.get((field, key, kind, value))
            if encoded is not None:
                parts.append(encoded)
                continue
        try:
            encoded = _message(field, _message(1, key.encode()) + _message(2, _value(value)))
        except Exception:
            log.exception("Failed to encode key %s", key)
            continue
        if memo:
            if len(_encoded) >= _KEPT:
                _encoded.clear()
            _encoded[field, key, kind, value] = encoded
        parts.append(encoded)
    return b"".join(parts)


def _value(value: Any) -> bytes:
    """An AnyValue's body: the package's _encode_value (None: an empty AnyValue)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _message(1, value.encode())
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise ValueError(f"Value out of range: {value}")
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _message(7, value)
    if isinstance(value, Sequence):
        return _message(5, b"".join(_message(1, _value(v)) for v in value))
    if isinstance(value, Mapping):
        pairs = (_message(1, _message(1, str(k).encode()) + _message(2, _value(v))) for k, v in value.items())
        return _message(6, b"".join(pairs))
    raise TypeError(f"Invalid type {type(value)} of value {value}")
