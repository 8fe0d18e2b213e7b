"""Generated from schedules.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "schedules.sql")
DUE_SCHEDULES = Q["DueSchedules"]
NOTIFY_RUN_READY = Q["NotifyRunReady"]
ADVANCE_SCHEDULE = Q["AdvanceSchedule"]
SCHEDULE_FAILED = Q["ScheduleFailed"]
DATABASE_NOW = Q["DatabaseNow"]
SET_SCHEDULE = Q["SetSchedule"]
DELETE_SCHEDULE = Q["DeleteSchedule"]
LIST_SCHEDULES = Q["ListSchedules"]


class DueSchedulesRow(Protocol):
    """A row of DueSchedules."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["name"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["cron"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["time_zone"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["input"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["next_tick"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["now"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class SetScheduleRow(Protocol):
    """A row of SetSchedule."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["name"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["cron"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["time_zone"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["input"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["next_tick"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["last_error"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["last_error_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ListSchedulesRow(Protocol):
    """A row of ListSchedules."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["name"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["cron"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["time_zone"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["input"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["next_tick"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["last_error"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["last_error_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def due_schedules(
    db: sql.Queryable, /, *, error_retry: timedelta | None, query_timeout: float | None = None
) -> list[DueSchedulesRow]:
    """DueSchedules (schedules.sql).

    The schedules due now, locked for this pass (another replica's pass skips them), at most 100
    (the rest wait for the next pass). One whose last tick failed waits :error_retry before it is
    tried again. now() is the pass's clock: the tick fired and the next one are computed from it.
    """
    return cast("list[DueSchedulesRow]", await db.fetch(DUE_SCHEDULES.sql, error_retry, timeout=query_timeout))


async def notify_run_ready(
    db: sql.Queryable, /, *, channel: str | None, project_id: str | None, query_timeout: float | None = None
) -> str:
    """NotifyRunReady (schedules.sql).

    The wake-up of the claims waiting on the project (sent at the commit of the pass).
    """
    return await db.execute(NOTIFY_RUN_READY.sql, channel, project_id, timeout=query_timeout)


async def advance_schedule(
    db: sql.Queryable,
    /,
    *,
    next_tick: datetime | None,
    error: str | None,
    project_id: str | None,
    name: str | None,
    query_timeout: float | None = None,
) -> str:
    """AdvanceSchedule (schedules.sql).

    After a fired tick: :next_tick is the next one ('infinity' when there is none; :error then
    says why, else NULL clears the schedule's last error).
    """
    return await db.execute(ADVANCE_SCHEDULE.sql, next_tick, error, project_id, name, timeout=query_timeout)


async def schedule_failed(
    db: sql.Queryable,
    /,
    *,
    error: str | None,
    project_id: str | None,
    name: str | None,
    query_timeout: float | None = None,
) -> str:
    """ScheduleFailed (schedules.sql).

    A tick that failed (rolled back alone): the error goes on the schedule, next_tick stays.
    """
    return await db.execute(SCHEDULE_FAILED.sql, error, project_id, name, timeout=query_timeout)


async def database_now(db: sql.Queryable, /, *, query_timeout: float | None = None) -> datetime:
    """DatabaseNow (schedules.sql).

    The store's clock, which every timestamp of a schedule comes from: SetSchedule's first tick
    is computed (in Python: cron is croniter's) from this now(), read in SetSchedule's transaction.
    """
    return cast("datetime", await db.fetchval(DATABASE_NOW.sql, timeout=query_timeout))


async def set_schedule(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    name: str | None,
    cron: str | None,
    time_zone: str | None,
    input: str | None,
    next_tick: datetime | None,
    actor: str | None,
    query_timeout: float | None = None,
) -> SetScheduleRow | None:
    """SetSchedule (schedules.sql).

    Creates or replaces a schedule (clearing its last error) with its SCHEDULE_SET audit row.
    """
    return cast(
        "SetScheduleRow | None",
        await db.fetchrow(
            SET_SCHEDULE.sql, project_id, name, cron, time_zone, input, next_tick, actor, timeout=query_timeout
        ),
    )


async def delete_schedule(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    name: str | None,
    actor: str | None,
    query_timeout: float | None = None,
) -> int | None:
    """DeleteSchedule (schedules.sql).

    Deletes a schedule with its SCHEDULE_DELETED audit row; n is 0 when there was none.
    """
    return cast("int | None", await db.fetchval(DELETE_SCHEDULE.sql, project_id, name, actor, timeout=query_timeout))


async def list_schedules(
    db: sql.Queryable, /, *, project_id: str | None, query_timeout: float | None = None
) -> list[ListSchedulesRow]:
    """ListSchedules (schedules.sql)."""
    return cast("list[ListSchedulesRow]", await db.fetch(LIST_SCHEDULES.sql, project_id, timeout=query_timeout))
