"""Generated from run_events.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "run_events.sql")
EMIT_RUN_EVENT = Q["EmitRunEvent"]
LAST_RUN_EVENT_SEQ = Q["LastRunEventSeq"]
RUN_EVENTS_AFTER = Q["RunEventsAfter"]
MARK_WATCHED = Q["MarkWatched"]


class EmitRunEventRow(Protocol):
    """A row of EmitRunEvent."""

    @overload
    def __getitem__(self, key: Literal["outcome"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["seq"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["progress_no"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["progress_bytes"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class RunEventsAfterRow(Protocol):
    """A row of RunEventsAfter."""

    @overload
    def __getitem__(self, key: Literal["seq"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["source"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["kind"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["data"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["attempt"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["actor"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["from_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["to_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def emit_run_event(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    attempt: int | None,
    projects: Sequence[str | None] | None,
    kind: str | None,
    data: str | None,
    emit_key: str | None,
    max_count: int | None,
    max_bytes: int | None,
    query_timeout: float | None = None,
) -> EmitRunEventRow | None:
    """EmitRunEvent (run_events.sql).

    A progress event of the caller's run under its fencing token (:run_id, :attempt) in the caller's
    :projects (NULL: any), with its :kind, :data and optional :emit_key, within the run's bounds
    (:max_count events, :max_bytes of data). One call of awooop_emit_run_event (migration 0180),
    which locks the run row and then assigns the next seq: outcome emitted, duplicate (the key's
    first event), exhausted or lease_lost. :data is the event's JSON text, parsed here (a text
    parameter: the pool's jsonb codec would encode the text once more, as a JSON string).
    """
    return cast(
        "EmitRunEventRow | None",
        await db.fetchrow(
            EMIT_RUN_EVENT.sql,
            run_id,
            attempt,
            projects,
            kind,
            data,
            emit_key,
            max_count,
            max_bytes,
            timeout=query_timeout,
        ),
    )


async def last_run_event_seq(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> int | None:
    """LastRunEventSeq (run_events.sql).

    The seq of a run's last log row (0: none yet): the highest offset WatchRun accepts. The newest
    row of the primary key, not max(seq): a generic plan made while the run had few rows may
    aggregate over all of them (migration 0250).
    """
    return cast("int | None", await db.fetchval(LAST_RUN_EVENT_SEQ.sql, run_id, timeout=query_timeout))


async def run_events_after(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    after: int | None,
    max_rows: int | None,
    query_timeout: float | None = None,
) -> list[RunEventsAfterRow]:
    """RunEventsAfter (run_events.sql).

    A run's log after offset :after, in order, at most :max_rows rows (the primary key's order).
    A state row written since migration 0360 has its change in columns (actor set) and its
    details as data; LogRow (run_events.py) serves it as the one JSON object of the older rows.
    """
    return cast(
        "list[RunEventsAfterRow]", await db.fetch(RUN_EVENTS_AFTER.sql, run_id, after, max_rows, timeout=query_timeout)
    )


async def mark_watched(
    db: sql.Queryable, /, *, run_id: UUID | str | None, ttl: float | None, query_timeout: float | None = None
) -> str:
    """MarkWatched (run_events.sql).

    Somebody watches the run until :ttl seconds from now: its new log rows send a NOTIFY on
    awooop_run_event (migration 0180's awooop_append_run_event) until then.
    """
    return await db.execute(MARK_WATCHED.sql, run_id, ttl, timeout=query_timeout)
