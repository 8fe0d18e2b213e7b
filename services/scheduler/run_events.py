"""A run's event log (migration 0180; docs/architecture.md "Watching a run"): progress events a
handler emits under its lease (EmitEvent), and the watch of a run (WatchRun): the log from an
offset, then live, until the run has ended (with until_saga_ends: and its saga too).

A watcher reads the log in pages after its offset, then waits for a wake-up on its run
(RunReadyListener.subscribe_run: the NOTIFY awooop_append_run_event sends for a watched run) or at
most AWOOOP_WATCH_POLL_INTERVAL, and reads again. It reads the run before each page: a run that
was already ended then has every row of its end in the log, so once a read after a terminal
status (and, with until_saga_ends, an ended saga: sagastate.SAGA_ENDED) comes back empty the
stream sends the run and ends. The saga's status changes are audited, so they wake the watcher
as any state change does."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg
import grpc

from services.common import errors
from services.common.access import check_run_access, projects_with
from services.common.auth import Principal
from services.common.db import Row
from services.common.run_events import EmitOutcome, EventSource
from services.common.runstate import TERMINAL
from services.common.sagastate import SAGA_ENDED
from services.scheduler import reads, reads_sql, run_events_sql
from services.scheduler.wakeup import RunReadyListener

WORKER_ROLE = "worker"
PAGE_ROWS = 500  # log rows read per query (and sent before the run is read again)
WATCH_TTL = 600.0  # seconds a watcher's MarkWatched lasts; renewed when half of it has passed


@dataclass(frozen=True)
class Emitted:
    offset: int
    duplicate: bool
    count: int


@dataclass(frozen=True)
class Bounds:
    max_count: int
    max_bytes: int


async def emit(
    pool: asyncpg.Pool,
    principal: Principal,
    run_id: str,
    attempt: int,
    kind: str,
    data_json: str,
    key: str | None,
    bounds: Bounds,
) -> Emitted:
    """Appends a progress event to the caller's leased run. LEASE_LOST for a stale token;
    RUN_EVENTS_EXHAUSTED past the run's bounds; NOT_FOUND for a run outside the caller's projects."""
    row = await run_events_sql.emit_run_event(
        pool,
        run_id=run_id,
        attempt=attempt,
        projects=projects_with(principal, WORKER_ROLE),
        kind=kind,
        data=data_json,
        emit_key=key,
        max_count=bounds.max_count,
        max_bytes=bounds.max_bytes,
    )
    assert row is not None  # the function always answers one row
    outcome = EmitOutcome(row["outcome"])
    if outcome is EmitOutcome.LEASE_LOST:
        run = await reads_sql.get_run(pool, run_id=run_id)
        check_run_access(principal, run["project_id"] if run is not None else None, WORKER_ROLE, run_id)
        raise errors.lease_lost(run_id, attempt)
    if outcome is EmitOutcome.EXHAUSTED:
        raise errors.ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            errors.RUN_EVENTS_EXHAUSTED,
            f"run {run_id} has emitted {row['progress_no']} progress events ({row['progress_bytes']} bytes of data); "
            f"at most {bounds.max_count} events and {bounds.max_bytes} bytes per run "
            "(AWOOOP_MAX_RUN_EVENTS, AWOOOP_MAX_RUN_EVENT_BYTES_TOTAL)",
            metadata={
                "run_id": run_id,
                "limit": str(bounds.max_count),
                "bytes_limit": str(bounds.max_bytes),
                "count": str(row["progress_no"]),
                "bytes": str(row["progress_bytes"]),
            },
        )
    return Emitted(int(row["seq"]), outcome is EmitOutcome.DUPLICATE, int(row["progress_no"]))


@dataclass(frozen=True)
class LogRow:
    offset: int
    source: EventSource
    kind: str
    data: dict[str, Any]
    attempt: int
    at: Any  # datetime

    @classmethod
    def of(cls, r: Row) -> LogRow:
        # the pool's jsonb codec (db.py) answers the row's object; every log row's data is one
        if r["actor"] is not None:
            data = state_data(r)
        elif r["source"] == EventSource.STEP:
            data = step_data(r)
        else:
            data = r["data"]
        return cls(int(r["seq"]), EventSource(r["source"]), r["kind"], data, r["attempt"], r["created_at"])


def state_data(r: Row) -> dict[str, Any]:
    """A compact state row (migration 0360: its change in columns, its details as data) as the
    one JSON object a state row was before: its change without the empty fields, then its details
    whole, in jsonb's key order (what a watcher read then)."""
    change = {"actor": r["actor"], "action": r["kind"], "reason": r["reason"]}
    data = {k: v for k, v in change.items() if v is not None}
    data["details"] = r["data"]
    for k in ("to_status", "from_status"):
        if r[k] is not None:
            data[k] = r[k]
    return data


def step_data(r: Row) -> dict[str, Any]:
    """A step's row (migration 0430: its status is the row's kind, its attempt the row's column)
    as the one JSON object a step row was before, in jsonb's key order (shorter keys first), what a
    watcher read then. A row written before 0430 holds both already, with the same values."""
    data = {**r["data"], "status": r["kind"], "attempt": r["attempt"]}
    return dict(sorted(data.items(), key=lambda kv: (len(kv[0].encode()), kv[0].encode())))


class Tail(Protocol):
    """A watch's follower of a token stream (token_streams.TokenTail)."""

    def from_row(self, row: LogRow) -> list[Any]: ...

    def wait(self, woken: asyncio.Event, timeout: float) -> AsyncIterator[Any]: ...

    async def drain(self) -> list[Any]: ...


@dataclass(frozen=True)
class Ended:
    """The last item of a watch: the run in its terminal state."""

    run: Row


class Watchers:
    """Counts one scheduler's WatchRun streams against AWOOOP_MAX_WATCHERS."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    @contextlib.contextmanager
    def slot(self) -> Any:
        if self.limit and self.active >= self.limit:
            raise errors.ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                errors.TOO_MANY_WATCHERS,
                f"this scheduler serves {self.active} WatchRun streams, its limit (AWOOOP_MAX_WATCHERS = "
                f"{self.limit}); retry later or on another replica",
                metadata={"limit": str(self.limit)},
            )
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1


async def open_watch(pool: asyncpg.Pool, principal: Principal, run_id: str, after: int) -> Row:
    """The run, once the caller may watch it from `after`: NOT_FOUND for another project's run,
    INVALID_ARGUMENT for an offset past the log's end."""
    run = await reads.get_run(pool, principal, run_id)
    last = await run_events_sql.last_run_event_seq(pool, run_id=run_id)
    if after < 0 or after > int(last or 0):
        raise errors.invalid(
            [("after", f"must be between 0 and the run's last offset ({int(last or 0)})")],
            f"offset {after} is not in run {run_id}'s log",
        )
    return run


async def watch(
    pool: asyncpg.Pool,
    listener: RunReadyListener,
    run_id: str,
    after: int,
    poll_interval: float,
    *,
    snapshot: bool = False,
    until_saga_ends: bool = False,
    tail: Tail | None = None,
) -> AsyncIterator[Any]:
    """The run's log after `after` (LogRow), then live, then Ended (call open_watch first); with
    snapshot, only the rows there are now; with until_saga_ends, Ended waits for the run's saga
    to end as well (its compensation's rows come first). With a token tail, its items too: the
    tokens of each checkpoint row after the row, and live tokens while waiting for the next row."""
    with listener.subscribe_run(run_id) as woken:
        marked_until = 0.0
        while True:
            if listener.stopping.is_set():  # the client resumes from its last offset elsewhere
                raise errors.shutting_down(f"this scheduler is shutting down; watch run {run_id} again after {after}")
            now = time.monotonic()
            if now >= marked_until and not snapshot:  # (re)announce the watch before reading, so no NOTIFY is skipped
                await run_events_sql.mark_watched(pool, run_id=run_id, ttl=WATCH_TTL)
                marked_until = now + WATCH_TTL / 2
            woken.clear()
            run = await reads_sql.get_run(pool, run_id=run_id)
            rows = await run_events_sql.run_events_after(pool, run_id=run_id, after=after, max_rows=PAGE_ROWS)
            for r in rows:
                item = LogRow.of(r)
                after = item.offset
                yield item
                for token_item in tail.from_row(item) if tail is not None else ():
                    yield token_item
            if rows:
                continue
            if snapshot:  # with a token tail: and the live tokens there are now
                for token_item in await tail.drain() if tail is not None else []:
                    yield token_item
                return
            if run is None:  # deleted by retention while watched: nothing more will come
                raise errors.not_found("run", run_id)
            if run["status"] in TERMINAL and (not until_saga_ends or run["saga_status"] in SAGA_ENDED):
                yield Ended(run)
                return
            wait = poll_interval if listener.poll_interval is None else min(poll_interval, listener.poll_interval)
            if tail is not None:
                async for token_item in tail.wait(woken, wait):
                    yield token_item
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout=wait)
