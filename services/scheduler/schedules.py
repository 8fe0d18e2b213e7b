"""Schedules (awooop_schedule; docs/flow-control.md): a cron expression in a time zone (croniter)
creates one run per tick.

Every scheduler replica runs the tick pass (AWOOOP_SCHEDULE_INTERVAL). A pass locks the due
schedules with FOR UPDATE SKIP LOCKED, fires each one's tick as an event through the ingest
statement (channel 'api', provider_event_id 'schedule:<name>:<tick>'), moves next_tick on and
commits, all in one transaction. Two replicas never fire a schedule at once, and should they
ever fire the same tick, the event dedupe makes it one run.

Catch-up: when a pass finds ticks missed (the scheduler was down), it fires only the latest
missed tick and skips the older ones; next_tick is then the first tick after now.
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

from services.common.audit import AUDIT_INSERT
from services.common.runs import RUN_READY_CHANNEL
from services.ingest import store
from services.ingest.parsing import NewEvent

log = logging.getLogger(__name__)

SCHEDULER_ACTOR = "system:schedules"
SCHEDULE_SET = "SCHEDULE_SET"
SCHEDULE_DELETED = "SCHEDULE_DELETED"
DUE_BATCH = 100


class ScheduleError(ValueError):
    """A cron expression or time zone that does not parse (the message says which)."""


def zone(name: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(f"unknown time zone {name!r}") from exc


def check_cron(cron: str) -> None:
    if not croniter.is_valid(cron):
        raise ScheduleError(f"not a cron expression: {cron!r} (5 fields, or 6 with seconds)")


def next_after(cron: str, time_zone: str, after: dt.datetime) -> dt.datetime:
    """The first tick strictly after `after`, in UTC."""
    t = croniter(cron, after.astimezone(zone(time_zone))).get_next(dt.datetime)
    assert isinstance(t, dt.datetime)
    return t.astimezone(dt.UTC)


def latest_at_or_before(cron: str, time_zone: str, now: dt.datetime) -> dt.datetime:
    """The latest tick at or before now, in UTC."""
    local = now.astimezone(zone(time_zone))
    it = croniter(cron, local + dt.timedelta(microseconds=1))
    t = it.get_prev(dt.datetime)
    assert isinstance(t, dt.datetime)
    return t.astimezone(dt.UTC)


def event_id(name: str, tick: dt.datetime) -> str:
    return f"schedule:{name}:{tick.astimezone(dt.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


DUE_SQL = f"""
SELECT project_id, name, cron, time_zone, input::text AS input, next_tick, now() AS now
  FROM awooop_schedule
 WHERE next_tick <= now()
 ORDER BY next_tick
 LIMIT {DUE_BATCH}
   FOR UPDATE SKIP LOCKED
"""

ADVANCE_SQL = "UPDATE awooop_schedule SET next_tick = $3, updated_at = now() WHERE project_id = $1 AND name = $2"


async def tick(pool: asyncpg.Pool, *, policy_defaults: str) -> int:
    """One pass: fires every due schedule's tick; returns the runs created."""
    created = 0
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(DUE_SQL)
        for r in rows:
            now: dt.datetime = r["now"]
            fire = max(r["next_tick"], latest_at_or_before(r["cron"], r["time_zone"], now))
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
                created += 1
                await conn.execute("SELECT pg_notify($1, $2)", RUN_READY_CHANNEL, r["project_id"])
            await conn.execute(ADVANCE_SQL, r["project_id"], r["name"], next_after(r["cron"], r["time_zone"], now))
    return created


# --- management ----------------------------------------------------------------------------------

SET_SQL = f"""
WITH s AS (
    INSERT INTO awooop_schedule (project_id, name, cron, time_zone, input, next_tick, created_by)
    VALUES ($1::text, $2::text, $3, $4, $5::text::jsonb, $6, $7)
    ON CONFLICT (project_id, name) DO UPDATE
       SET cron = EXCLUDED.cron, time_zone = EXCLUDED.time_zone, input = EXCLUDED.input,
           next_tick = EXCLUDED.next_tick, updated_at = now()
    RETURNING project_id, name, cron, time_zone, input, next_tick
),
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, NULL, $7, '{SCHEDULE_SET}', NULL, NULL, NULL,
           jsonb_build_object('name', name, 'cron', cron, 'time_zone', time_zone)
      FROM s
)
SELECT * FROM s
"""

DELETE_SQL = f"""
WITH d AS (DELETE FROM awooop_schedule WHERE project_id = $1::text AND name = $2::text RETURNING project_id, name),
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, NULL, $3, '{SCHEDULE_DELETED}', NULL, NULL, NULL, jsonb_build_object('name', name) FROM d
)
SELECT count(*) AS n FROM d
"""

LIST_SQL = """SELECT project_id, name, cron, time_zone, input, next_tick FROM awooop_schedule
               WHERE project_id = $1 ORDER BY name"""


@dataclass(frozen=True)
class Schedule:
    project_id: str
    name: str
    cron: str
    time_zone: str
    input: dict[str, Any]
    next_tick: dt.datetime


def _schedule(r: asyncpg.Record) -> Schedule:
    data = r["input"]
    if isinstance(data, str):
        data = json.loads(data)
    return Schedule(r["project_id"], r["name"], r["cron"], r["time_zone"], data, r["next_tick"])


async def set_schedule(
    pool: asyncpg.Pool, project_id: str, name: str, cron: str, time_zone: str, input_json: str, actor: str
) -> Schedule:
    """Creates or replaces a schedule; its first tick is the first after now (raises ScheduleError)."""
    check_cron(cron)
    first = next_after(cron, time_zone, dt.datetime.now(dt.UTC))
    row = await pool.fetchrow(SET_SQL, project_id, name, cron, time_zone, input_json, first, actor)
    assert row is not None
    return _schedule(row)


async def delete_schedule(pool: asyncpg.Pool, project_id: str, name: str, actor: str) -> bool:
    return bool(await pool.fetchval(DELETE_SQL, project_id, name, actor))


async def list_schedules(pool: asyncpg.Pool, project_id: str) -> list[Schedule]:
    return [_schedule(r) for r in await pool.fetch(LIST_SQL, project_id)]
