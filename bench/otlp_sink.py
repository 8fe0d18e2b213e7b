"""An OTLP/gRPC trace receiver that counts and discards spans: the endpoint of the service
processes' exporter while `./dev bench --tracing` measures the cost of tracing (export work
included, without a collector's own CPU in the figures' way)."""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class _Counting(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans = 0
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> trace_service_pb2.ExportTraceServiceResponse:
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self._lock:
            self.spans += n
        return trace_service_pb2.ExportTraceServiceResponse()


class Sink:
    def __init__(self) -> None:
        self.counter = _Counting()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self.counter, self.server)
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
