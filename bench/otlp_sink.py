"""An OTLP/gRPC trace receiver that counts and discards spans (a test can keep their names): the endpoint of the service
processes' exporter while `./dev bench --tracing` measures the cost of tracing (export work
included, without a collector's own CPU in the figures' way)."""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class _Counting(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, keep: bool) -> None:
        self.spans = 0
        self.keep = keep
        self.kept: list[tuple[dict[str, str], str]] = []  # (resource attributes, span name) when keep
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> trace_service_pb2.ExportTraceServiceResponse:
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self._lock:
            self.spans += n
            if self.keep:
                for rs in request.resource_spans:
                    attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                    self.kept += [(attrs, sp.name) for ss in rs.scope_spans for sp in ss.spans]
        return trace_service_pb2.ExportTraceServiceResponse()


class Sink:
    """keep: also remember each span's name and resource (tests)."""

    def __init__(self, keep: bool = False) -> None:
        self.counter = _Counting(keep)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self.counter, self.server)  # type: ignore[no-untyped-call]
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def start(self) -> Sink:
        self.server.start()
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> int:
        """Stops; returns the spans received."""
        self.server.stop(1).wait()
        return self.counter.spans
