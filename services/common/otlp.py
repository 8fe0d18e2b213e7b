"""The OTLP/gRPC span exporter of opentelemetry-exporter-otlp-proto-grpc, with a leaner encoding.

The package's encoder (opentelemetry-exporter-otlp-proto-common) builds every attribute, span,
scope and resource as a separate message and passes it to its parent's constructor, which copies
it (upb merges by serializing and parsing again), and hashes each span's Resource (a JSON dump of
its attributes) to group the spans: about 25 µs per server span here, the largest part of what
tracing costs an ingest call (docs/benchmarks.md). This builds the same ExportTraceServiceRequest
in place (the test compares the bytes with the package's encoder). Everything else, endpoint,
headers, TLS, compression, timeout and retries from the OTEL_EXPORTER_OTLP_* variables, is the
package's exporter; should a later version stop calling `_translate_data`, its own encoder is
used and only the speed is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PBSpan
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags
from opentelemetry.sdk.trace import ReadableSpan
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


class LeanOTLPSpanExporter(OTLPSpanExporter):
    def _translate_data(self, data: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
        return encode_spans(data)


def encode_spans(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """What opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans returns."""
    request = ExportTraceServiceRequest()
    resources: dict[int, tuple[Any, dict[Any, Any]]] = {}  # id(Resource) -> (ResourceSpans, scope -> ScopeSpans)
    for s in spans:
        resource = s.resource
        entry = resources.get(id(resource))
        if entry is None:
            rs = request.resource_spans.add(schema_url=resource.schema_url)
            rs.resource.SetInParent()
            _attributes(rs.resource.attributes, resource.attributes)
            entry = resources[id(resource)] = (rs, {})
        rs, scopes = entry
        scope = s.instrumentation_scope
        ss = scopes.get(scope)
        if ss is None:
            ss = scopes[scope] = rs.scope_spans.add()
            ss.scope.SetInParent()
            if scope is not None:
                ss.scope.name = scope.name
                ss.scope.version = scope.version or ""
                ss.schema_url = scope.schema_url or ""
                _attributes(ss.scope.attributes, scope.attributes)
        _span(ss.spans.add(), s)
    return request


def _span(p: Any, s: ReadableSpan) -> None:
    sc = s.get_span_context()
    assert sc is not None  # an SDK span always has its context
    parent = s.parent
    p.trace_id = sc.trace_id.to_bytes(16, "big")
    p.span_id = sc.span_id.to_bytes(8, "big")
    if sc.trace_state:
        p.trace_state = ",".join(f"{k}={v}" for k, v in sc.trace_state.items())
    if parent is not None:
        p.parent_span_id = parent.span_id.to_bytes(8, "big")
    p.name = s.name
    p.kind = _KIND[s.kind]
    p.start_time_unix_nano = s.start_time or 0
    p.end_time_unix_nano = s.end_time or 0
    _attributes(p.attributes, s.attributes)
    for e in s.events:
        pe = p.events.add(name=e.name, time_unix_nano=e.timestamp, dropped_attributes_count=e.dropped_attributes)
        _attributes(pe.attributes, e.attributes)
    for link in s.links:
        lc = link.context
        pl = p.links.add(
            trace_id=lc.trace_id.to_bytes(16, "big"),
            span_id=lc.span_id.to_bytes(8, "big"),
            dropped_attributes_count=link.dropped_attributes,
            flags=_HAS_REMOTE | (_IS_REMOTE if lc.is_remote else 0),
        )
        _attributes(pl.attributes, link.attributes)
    status = s.status
    if status is not None:
        p.status.SetInParent()
        p.status.code = status.status_code.value
        p.status.message = status.description or ""
    p.dropped_attributes_count = s.dropped_attributes
    p.dropped_events_count = s.dropped_events
    p.dropped_links_count = s.dropped_links
    p.flags = _HAS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0)


def _attributes(repeated: Any, attributes: Mapping[str, Any] | None) -> None:
    if not attributes:
        return
    add = repeated.add
    for key, value in attributes.items():
        if type(value) is str:  # most attributes: the short way
            add(key=key).value.string_value = value
            continue
        try:
            _value(add(key=key).value, value)
        except Exception:  # as the package's encoder: the attribute is left out, the span kept
            del repeated[-1]
            log.exception("Failed to encode key %s", key)


def _value(pb: Any, value: Any) -> None:
    # the package's _encode_value, in place (None stays an empty AnyValue)
    if value is None:
        return
    if isinstance(value, bool):
        pb.bool_value = value
    elif isinstance(value, str):
        pb.string_value = value
    elif isinstance(value, int):
        pb.int_value = value
    elif isinstance(value, float):
        pb.double_value = value
    elif isinstance(value, bytes):
        pb.bytes_value = value
    elif isinstance(value, Sequence):
        array = pb.array_value
        array.SetInParent()
        for v in value:
            _value(array.values.add(), v)
    elif isinstance(value, Mapping):
        kvlist = pb.kvlist_value
        kvlist.SetInParent()
        for k, v in value.items():
            _value(kvlist.values.add(key=str(k)).value, v)
    else:
        raise TypeError(f"Invalid type {type(value)} of value {value}")
