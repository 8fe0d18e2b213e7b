"""EmitEvent, PublishTokens and WatchRun: validate, call run_events (the bounded append, the watch
stream under the AWOOOP_MAX_WATCHERS slots) and token_streams (the live channel, checkpoints, a
watch's token tail), build the answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import grpc

from awooop.scheduler.v1 import scheduler_pb2
from services.common.auth import current_principal
from services.common.cache import Cache
from services.common.limits import MAX_EMIT_KEY, MAX_EVENT_KIND
from services.common.run_events import EventSource
from services.common.runs import run_to_pb, set_attempts_used, ts
from services.common.settings import Settings
from services.common.validate import Violations, to_struct
from services.scheduler import run_events, token_streams
from services.scheduler.live_tokens import LiveChannel, now_ms
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


def _token_item_pb(item: token_streams.TokenItem) -> scheduler_pb2.WatchRunResponse:
    if isinstance(item, token_streams.Tokens):
        batch = scheduler_pb2.TokenBatch(
            stream=item.stream,
            attempt=item.attempt,
            first_seq=item.first_seq,
            tokens=item.tokens,
            from_checkpoint=item.from_checkpoint,
        )
        if item.produced_at is not None:
            batch.produced_at.FromDatetime(item.produced_at)
        return scheduler_pb2.WatchRunResponse(token_batch=batch)
    if isinstance(item, token_streams.Gap):
        gap = scheduler_pb2.TokenGap(
            stream=item.stream, attempt=item.attempt, from_seq=item.from_seq, to_seq=item.to_seq, reason=item.reason
        )
        return scheduler_pb2.WatchRunResponse(token_gap=gap)
    return scheduler_pb2.WatchRunResponse(
        token_channel=scheduler_pb2.TokenChannel(live=item.live, message=item.message)
    )


class WatchRpcs:
    def __init__(self, pool: asyncpg.Pool, settings: Settings, listener: RunReadyListener, cache: Cache) -> None:
        self.pool = pool
        self.settings = settings
        self.listener = listener
        self.watchers = run_events.Watchers(settings.max_watchers)
        self.channel = LiveChannel(cache, settings.stream_live_entries, settings.stream_live_ttl)
        self.leases = token_streams.LeaseChecks(settings.stream_lease_check)

    async def publish_tokens(self, request: scheduler_pb2.PublishTokensRequest) -> scheduler_pb2.PublishTokensResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
        stream = v.token("stream", request.stream, max_len=token_streams.MAX_STREAM_NAME, required=False)
        v.check(request.first_seq >= 1, "first_seq", "must be at least 1 (tokens are numbered from 1)")
        size = sum(len(t.encode()) + token_streams.TOKEN_OVERHEAD for t in request.tokens)
        limit = self.settings.max_run_event_bytes // 2
        v.check(
            size <= limit,
            "tokens",
            f"at most {limit} bytes per batch (half AWOOOP_MAX_RUN_EVENT_BYTES; token text and "
            f"{token_streams.TOKEN_OVERHEAD} bytes a token)",
        )
        v.raise_if_any()
        produced = request.produced_at.ToMilliseconds() if request.HasField("produced_at") else now_ms()
        batch = token_streams.Batch(
            run_id,
            attempt,
            stream or token_streams.DEFAULT_STREAM,
            request.first_seq,
            list(request.tokens),
            produced,
            request.checkpoint,
        )
        bounds = run_events.Bounds(self.settings.max_run_events, self.settings.max_run_event_bytes_total)
        done = await token_streams.publish(
            self.pool, self.channel, self.leases, current_principal(), batch, bounds, self.settings.max_run_event_bytes
        )
        s = self.settings
        return scheduler_pb2.PublishTokensResponse(
            live=done.live,
            checkpoint_offset=done.checkpoint_offset,
            checkpoint_tokens=s.stream_checkpoint_tokens,
            checkpoint_ms=s.stream_checkpoint_ms,
            checkpoint_bytes=min(s.stream_checkpoint_bytes, limit),
        )

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
        stream = v.token("token_stream", request.token_stream, max_len=token_streams.MAX_STREAM_NAME, required=False)
        v.check(request.token_attempt >= 0 and request.token_after >= 0, "token_after", "must not be negative")
        v.raise_if_any()
        tail = None
        if request.tokens:  # a snapshot: the checkpoints' tokens and the live ones there are now
            name = stream or token_streams.DEFAULT_STREAM
            tail = token_streams.TokenTail(self.channel, run_id, name, request.token_attempt, request.token_after)
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
                tail=tail,
            )
            for notice in token_streams.first_notice(tail) if tail is not None else ():
                yield _token_item_pb(notice)
            async for item in items:
                if isinstance(item, run_events.Ended):
                    run = run_to_pb(item.run)
                    set_attempts_used(run, item.run)  # GetRun's row
                    yield scheduler_pb2.WatchRunResponse(run=run)
                elif isinstance(item, run_events.LogRow):
                    yield scheduler_pb2.WatchRunResponse(event=_watch_event_pb(item))
                else:
                    yield _token_item_pb(item)
