"""Schedules (awooop_schedule; docs/flow-control.md): a cron expression in a time zone (croniter)
creates one run per tick.

Every scheduler replica runs the tick pass (AWOOOP_SCHEDULE_INTERVAL). A pass locks the due
schedules with FOR UPDATE SKIP LOCKED, fires each one's tick as an event through the ingest
statement (channel 'api', provider_event_id 'schedule:<name>:<tick>'), moves next_tick on and
commits, all in one transaction. Two replicas never fire a schedule at once, and should they
ever fire the same tick, the event dedupe makes it one run. That statement is the ingest
service's own (services/ingest/store.py), the one place a service imports another
(docs/architecture.md says why).

Every time is the store's: a pass fires and computes the next tick from its now(), and a new
schedule's first tick is the first after the now() of the transaction that writes it.

Catch-up: when a pass finds ticks missed (the scheduler was down), it fires only the latest
missed tick and skips the older ones; next_tick is then the first tick after now.

A schedule has no status column, so no declared states: whether it is due (next_tick <= now()),
resting after a failed tick (last_error_at within ERROR_RETRY) or spent (next_tick 'infinity',
NEVER here, with last_error saying why) is read from its columns by DueSchedules.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import zoneinfo
from dataclasses import dataclass
from typing import Any

import asyncpg
from croniter import croniter

from services.common import loops
from services.common.db import Conn
from services.common.limits import MAX_TIME_ZONE
from services.common.runs import RUN_READY_CHANNEL
from services.ingest import store
from services.ingest.parsing import NewEvent
from services.scheduler import schedules_sql

log = logging.getLogger(__name__)

SCHEDULER_ACTOR = "system:schedules"


# A schedule whose tick cannot be computed (it can never fire again, e.g. a year field in the
# past) is tried again this much later, with the error on the schedule, instead of every pass.
ERROR_RETRY = dt.timedelta(hours=1)
LOOP = "scheduler.schedules"


class ScheduleError(ValueError):
    """A cron expression or time zone that does not parse or never fires (the message says which)."""


def zone(name: str) -> zoneinfo.ZoneInfo:
    if len(name) > MAX_TIME_ZONE:
        raise ScheduleError(f"unknown time zone (longer than {MAX_TIME_ZONE} characters)")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ScheduleError(f"unknown time zone {name!r}") from exc


def croniter_fields(cron: str) -> str:
    """The expression in croniter's field order. Ours (docs/flow-control.md): 5 fields (minute
    hour day month weekday); 6 with seconds first; 7 with seconds first and the year last, as
    Quartz and Spring write them. croniter reads seconds as the sixth field and the year as the
    seventh, so seconds move from the front to after the weekday."""
    fields = cron.split()
    if len(fields) in (6, 7):
        fields = [*fields[1:6], fields[0], *fields[6:]]
    return " ".join(fields)


def _iter(cron: str, start: dt.datetime) -> croniter:
    try:
        return croniter(croniter_fields(cron), start)
    except (ValueError, KeyError, TypeError) as exc:  # croniter's CroniterError is a ValueError
        raise ScheduleError(f"not a cron expression: {cron!r} ({exc})") from exc


def check_cron(cron: str) -> None:
    fields = len(cron.split())
    if fields not in (5, 6, 7) or not croniter.is_valid(croniter_fields(cron)):
        raise ScheduleError(
            f"not a cron expression: {cron!r} (5 fields; 6 with seconds first; 7 with seconds first and a year)"
        )


def next_after(cron: str, time_zone: str, after: dt.datetime) -> dt.datetime:
    """The first tick strictly after `after`, in UTC (ScheduleError: there is none)."""
    try:
        t = _iter(cron, after.astimezone(zone(time_zone))).get_next(dt.datetime)
    except ScheduleError:
        raise
    except (ValueError, OverflowError) as exc:  # CroniterBadDateError: no such date ahead
        raise ScheduleError(f"{cron!r} never fires after {after.isoformat()}") from exc
    assert isinstance(t, dt.datetime)
    return t.astimezone(dt.UTC)


def latest_at_or_before(cron: str, time_zone: str, now: dt.datetime) -> dt.datetime | None:
    """The latest tick at or before now, in UTC (None: there was none)."""
    local = now.astimezone(zone(time_zone))
    try:
        t = _iter(cron, local + dt.timedelta(microseconds=1)).get_prev(dt.datetime)
    except ScheduleError:
        raise
    except (ValueError, OverflowError):
        return None
    assert isinstance(t, dt.datetime)
    return t.astimezone(dt.UTC)


def event_id(name: str, tick: dt.datetime) -> str:
    return f"schedule:{name}:{tick.astimezone(dt.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


NEVER = dt.datetime.max.replace(tzinfo=dt.UTC)  # stored as 'infinity'


async def tick(pool: asyncpg.Pool, *, policy_defaults: str) -> int:
    """One pass: fires every due schedule's tick; returns the runs created. A schedule whose
    tick fails is rolled back alone (a savepoint), logged, counted and marked with its error,
    and the pass goes on for every other schedule."""
    created = 0
    async with pool.acquire() as conn, conn.transaction():
        for r in await schedules_sql.due_schedules(conn, error_retry=ERROR_RETRY):
            try:
                async with conn.transaction():
                    created += await _fire(conn, r, policy_defaults)
            except Exception as exc:
                loops.row_failed(LOOP, f"schedule {r['name']!r} of project {r['project_id']!r}", exc)
                await schedules_sql.schedule_failed(
                    conn, project_id=r["project_id"], name=r["name"], error=loops.describe(exc)
                )
    return created


async def _fire(conn: Conn, r: schedules_sql.DueSchedulesRow, policy_defaults: str) -> int:
    """Fires the schedule's due tick (the latest one missed) and moves next_tick on."""
    now: dt.datetime = r["now"]
    latest = latest_at_or_before(r["cron"], r["time_zone"], now)
    fire = max(r["next_tick"], latest) if latest else r["next_tick"]
    try:
        nxt, error = next_after(r["cron"], r["time_zone"], now), None
    except ScheduleError as exc:  # the tick due now is its last: fire it, then the schedule rests
        nxt, error = NEVER, str(exc)
        log.warning("schedule %r of project %r has no tick after this one", r["name"], r["project_id"])
    ev = NewEvent(r["project_id"], "api", event_id(r["name"], fire), r["input"], 0)
    (stored,) = await store.ingest(
        conn,
        [ev],
        principal_id=SCHEDULER_ACTOR,
        actor=SCHEDULER_ACTOR,
        retention=7 * 86400.0,
        defaults_json=policy_defaults,
    )
    if stored.created:
        await schedules_sql.notify_run_ready(conn, channel=RUN_READY_CHANNEL, project_id=r["project_id"])
    await schedules_sql.advance_schedule(conn, project_id=r["project_id"], name=r["name"], next_tick=nxt, error=error)
    return 1 if stored.created else 0


# --- management ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    project_id: str
    name: str
    cron: str
    time_zone: str
    input: dict[str, Any]
    next_tick: dt.datetime  # NEVER: no tick is left (last_error says why)
    last_error: str | None = None  # why its last tick failed, or why none is left
    last_error_at: dt.datetime | None = None


def _schedule(r: schedules_sql.SetScheduleRow | schedules_sql.ListSchedulesRow) -> Schedule:
    data = r["input"]
    if isinstance(data, str):
        data = json.loads(data)
    return Schedule(
        r["project_id"], r["name"], r["cron"], r["time_zone"], data, r["next_tick"], r["last_error"], r["last_error_at"]
    )


async def set_schedule(
    pool: asyncpg.Pool, project_id: str, name: str, cron: str, time_zone: str, input_json: str, actor: str
) -> Schedule:
    """Creates or replaces a schedule; its first tick is the first after the store's now()
    (raises ScheduleError)."""
    check_cron(cron)
    async with pool.acquire() as conn, conn.transaction():
        now: dt.datetime = await schedules_sql.database_now(conn)
        first = next_after(cron, time_zone, now)
        row = await schedules_sql.set_schedule(
            conn,
            project_id=project_id,
            name=name,
            cron=cron,
            time_zone=time_zone,
            input=input_json,
            next_tick=first,
            actor=actor,
        )
    assert row is not None
    return _schedule(row)


async def delete_schedule(pool: asyncpg.Pool, project_id: str, name: str, actor: str) -> bool:
    return bool(await schedules_sql.delete_schedule(pool, project_id=project_id, name=name, actor=actor))


async def list_schedules(pool: asyncpg.Pool, project_id: str) -> list[Schedule]:
    return [_schedule(r) for r in await schedules_sql.list_schedules(pool, project_id=project_id)]
