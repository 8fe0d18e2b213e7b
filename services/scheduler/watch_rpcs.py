"""EmitEvent and WatchRun: validate, call run_events (the bounded append, the watch stream under
the AWOOOP_MAX_WATCHERS slots), build the answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import grpc

from awooop.scheduler.v1 import scheduler_pb2
from services.common.auth import current_principal
from services.common.limits import MAX_EMIT_KEY, MAX_EVENT_KIND
from services.common.run_events import EventSource
from services.common.runs import run_to_pb, set_attempts_used, ts
from services.common.settings import Settings
from services.common.validate import Violations, to_struct
from services.scheduler import run_events
from services.scheduler.rpc_fields import lease
from services.scheduler.wakeup import RunReadyListener

_SOURCES: dict[EventSource, scheduler_pb2.RunEventSource.ValueType] = {
    EventSource.STATE: scheduler_pb2.RUN_EVENT_SOURCE_STATE,
    EventSource.STEP: scheduler_pb2.RUN_EVENT_SOURCE_STEP,
    EventSource.PROGRESS: scheduler_pb2.RUN_EVENT_SOURCE_PROGRESS,
}


def _watch_event_pb(row: run_events.LogRow) -> scheduler_pb2.WatchEvent:
    return scheduler_pb2.WatchEvent(
        offset=row.offset,
        source=_SOURCES[row.source],
        kind=row.kind,
        data=to_struct(row.data if isinstance(row.data, dict) else {"value": row.data}),
        attempt=row.attempt,
        at=ts(row.at),
    )


class WatchRpcs:
    def __init__(self, pool: asyncpg.Pool, settings: Settings, listener: RunReadyListener) -> None:
        self.pool = pool
        self.settings = settings
        self.listener = listener
        self.watchers = run_events.Watchers(settings.max_watchers)

    async def emit_event(self, request: scheduler_pb2.EmitEventRequest) -> scheduler_pb2.EmitEventResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
        kind = v.text("kind", request.kind, max_len=MAX_EVENT_KIND)
        key = v.token("key", request.key, max_len=MAX_EMIT_KEY, required=False)
        _, data_json = v.json("data", request.data, max_bytes=self.settings.max_run_event_bytes)
        v.raise_if_any()
        bounds = run_events.Bounds(self.settings.max_run_events, self.settings.max_run_event_bytes_total)
        emitted = await run_events.emit(
            self.pool, current_principal(), run_id, attempt, kind, data_json, key or None, bounds
        )
        return scheduler_pb2.EmitEventResponse(offset=emitted.offset, duplicate=emitted.duplicate, count=emitted.count)

    async def watch_run(
        self, request: scheduler_pb2.WatchRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[scheduler_pb2.WatchRunResponse]:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        v.check(request.after >= 0, "after", "must not be negative (the last offset received; 0: from the start)")
        v.raise_if_any()
        with self.watchers.slot():
            await run_events.open_watch(self.pool, current_principal(), run_id, request.after)
            await context.send_initial_metadata(())  # tells an SSE relay the watch was accepted
            items = run_events.watch(
                self.pool,
                self.listener,
                run_id,
                request.after,
                self.settings.watch_poll_interval,
                snapshot=request.snapshot,
                until_saga_ends=request.until_saga_ends,
            )
            async for item in items:
                if isinstance(item, run_events.Ended):
                    run = run_to_pb(item.run)
                    set_attempts_used(run, item.run)  # GetRun's row
                    yield scheduler_pb2.WatchRunResponse(run=run)
                else:
                    yield scheduler_pb2.WatchRunResponse(event=_watch_event_pb(item))
