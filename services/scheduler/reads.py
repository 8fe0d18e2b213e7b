"""GetRun, ListRuns and GetRunHistory: one statement each, tenant-checked after the read
(a caller without a role in the run's project gets NOT_FOUND, see services/common/access.py)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from dataclasses import dataclass

import asyncpg

from services.common import errors
from services.common.access import check_run_access
from services.common.auth import Principal
from services.scheduler import reads_sql

ANY_ROLE = ("ingest", "worker", "approver", "admin")
HISTORY_LIMIT = 1000  # events returned by GetRunHistory (a run's history is short: one row per change)


@dataclass(frozen=True)
class RunFilter:
    """ListRuns' filters; None means no filter on that column."""

    statuses: list[str] | None = None
    channels: list[str] | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    provider_event_id: str | None = None
    saga_statuses: list[str] | None = None
    parent_run_id: str | None = None  # a run's children
    build_id: str | None = None  # the runs on a worker build


async def get_run(pool: asyncpg.Pool, principal: Principal, run_id: str) -> reads_sql.GetRunRow:
    row = await reads_sql.get_run(pool, run_id=run_id)
    if row is None:
        raise errors.not_found("run", run_id)
    check_run_access(principal, row["project_id"], ANY_ROLE, run_id)
    return row


# --- page tokens: opaque to callers, urlsafe base64 of the last row's (created_at, run_id) ---

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def encode_page_token(created_at: dt.datetime, run_id: uuid.UUID) -> str:
    micros = (created_at - _EPOCH) // dt.timedelta(microseconds=1)
    raw = json.dumps({"c": micros, "r": str(run_id)}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_page_token(token: str) -> tuple[dt.datetime, uuid.UUID] | None:
    """(created_at, run_id) of a token from encode_page_token; None when it is not one."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        micros, run_id = data["c"], uuid.UUID(data["r"])
        if not isinstance(micros, int) or isinstance(micros, bool):
            return None
        return _EPOCH + dt.timedelta(microseconds=micros), run_id
    except (binascii.Error, ValueError, TypeError, KeyError, OverflowError):
        return None


async def list_runs(
    pool: asyncpg.Pool,
    project_id: str,
    where: RunFilter,
    page_size: int,
    after: tuple[dt.datetime, uuid.UUID] | None,
) -> tuple[list[reads_sql.ListRunsRow], str]:
    """A page of runs and the next page's token ('' on the last page)."""
    after_created_at, after_run_id = after if after is not None else (None, None)
    rows = await reads_sql.list_runs(
        pool,
        project_id=project_id,
        page_rows=page_size + 1,
        after_created_at=after_created_at,
        after_run_id=after_run_id,
        statuses=where.statuses,
        channels=where.channels,
        created_after=where.created_after,
        created_before=where.created_before,
        provider_event_id=where.provider_event_id,
        saga_statuses=where.saga_statuses,
        parent_run_id=where.parent_run_id,
        build_id=where.build_id,
    )
    if len(rows) <= page_size:
        return list(rows), ""
    page = list(rows[:page_size])
    last = page[-1]
    return page, encode_page_token(last["created_at"], last["run_id"])


async def history(pool: asyncpg.Pool, principal: Principal, run_id: str) -> list[reads_sql.RunHistoryRow]:
    rows = await reads_sql.run_history(pool, run_id=run_id, max_events=HISTORY_LIMIT)
    if not rows:
        raise errors.not_found("run", run_id)
    check_run_access(principal, rows[0]["run_project"], ANY_ROLE, run_id)
    return [r for r in rows if r["action"] is not None]
