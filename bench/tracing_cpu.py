"""CPU per call that tracing adds, steadier than the `tracing` group's throughput ratios on a
loaded machine: one process serves and calls a trivial unary method through the service
interceptor (and tracing's interceptor when on), 32 in flight, 4,000 calls after 500 warm-up,
measured with `time.process_time`; spans go through the SDK's BatchSpanProcessor to an exporter
that discards them. Run each sampler in a fresh process, alternating, from the tree under test:

    python bench/tracing_cpu.py off|always_on|ratio|always_off

prints the sampler and µs of CPU per call (docs/benchmarks.md, "Tracing on the stock packages")."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from services.common import tracing  # noqa: E402
from services.common.interceptor import ServiceInterceptor  # noqa: E402

CALLS, IN_FLIGHT, WARMUP = 4000, 32, 500


def _configure(mode: str) -> None:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBasedTraceIdRatio

    class Discard(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    sampler = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF, "ratio": ParentBasedTraceIdRatio(0.1)}[mode]
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    tracing.configure(provider)


async def main(mode: str) -> float:
    if mode != "off":
        _configure(mode)

    async def say(request: bytes, context: Any) -> bytes:
        tracing.current_traceparent()  # what IngestEvent does for the run it stores
        return request

    handler = grpc.method_handlers_generic_handler("t.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)})
    service = ServiceInterceptor(None, access_log=False, authenticate=False)  # type: ignore[arg-type]
    server = grpc.aio.server(interceptors=[*tracing.server_interceptors(), service])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/t.Echo/Say")
        slots = asyncio.Semaphore(IN_FLIGHT)

        async def one() -> None:
            async with slots:
                await call(b"x" * 40)

        await asyncio.gather(*(one() for _ in range(WARMUP)))
        started = time.process_time()
        await asyncio.gather(*(one() for _ in range(CALLS)))
        cpu = time.process_time() - started
    await server.stop(None)
    return cpu / CALLS * 1e6


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "off"
    print(f"{mode} {asyncio.run(main(mode)):.1f}")
