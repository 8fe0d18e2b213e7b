"""Wires the ingest service into the runtime: the servicer, the wake-up notifier and the
retention loop."""

from __future__ import annotations

from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from services.common.auth import Authenticator
from services.common.loops import periodic
from services.common.runtime import AppContext, ServiceParts
from services.ingest import retention, run_stream, wait_callbacks
from services.ingest.http import HttpIngest
from services.ingest.servicer import IngestServicer
from services.ingest.wakeup import Notifier

SERVICE_NAME = ingest_pb2.DESCRIPTOR.services_by_name["IngestService"].full_name


def build(ctx: AppContext) -> ServiceParts:
    s = ctx.settings
    notifier = Notifier(ctx.pool)
    servicer = IngestServicer(ctx, notifier)

    async def wakeup_loop() -> None:
        await notifier.run(ctx.stopping)

    async def retention_loop() -> None:
        async def one_pass() -> None:
            await retention.prune(ctx.pool, ctx.cache, s)

        await periodic("ingest-retention", s.prune_interval, one_pass, ctx.stopping)

    # the HTTP side calls the same logic objects as the gRPC servicer
    http = HttpIngest(s, servicer.events, servicer.directory, Authenticator(ctx.pool, s.auth_cache_seconds))
    http_app = http.app() if s.http_port else None
    if http_app is not None:  # durable waits' callback URLs
        wait_callbacks.add_routes(http_app, ctx.pool, s)
        run_stream.add_routes(http_app, s)  # run event streams (SSE), through the scheduler's WatchRun

    return ServiceParts(
        servicers=[(ingest_pb2_grpc.add_IngestServiceServicer_to_server, servicer)],
        service_names=[SERVICE_NAME],
        background=[wakeup_loop, retention_loop],
        on_stop=[servicer.events.drain],
        http_app=http_app,
    )
