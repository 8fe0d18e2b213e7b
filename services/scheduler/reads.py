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
from services.common.runs import RUN_COLUMNS

ANY_ROLE = ("ingest", "worker", "approver", "admin")
HISTORY_LIMIT = 1000  # events returned by GetRunHistory (a run's history is short: one row per change)

GET_SQL = f"SELECT {RUN_COLUMNS} FROM awooop_run_state WHERE run_id = $1"

# Newest first, keyset-paginated on (created_at DESC, run_id) to follow awooop_run_list_idx.
# $1 project, $2 statuses (NULL: all), $3 limit, $4 channels (NULL: all), $5 created at or after,
# $6 created before, $7 provider event id (NULL: any), $8 saga statuses (NULL: all); next pages:
# $9 created_at, $10 run_id of the last row.
LIST_FILTER = """project_id = $1 AND ($2::text[] IS NULL OR status = ANY($2::text[]))
   AND ($4::text[] IS NULL OR channel_type = ANY($4::text[]))
   AND ($5::timestamptz IS NULL OR created_at >= $5) AND ($6::timestamptz IS NULL OR created_at < $6)
   AND ($7::text IS NULL OR provider_event_id = $7)
   AND ($8::text[] IS NULL OR saga_status = ANY($8::text[]))"""

LIST_FIRST_SQL = f"""
SELECT {RUN_COLUMNS} FROM awooop_run_state
 WHERE {LIST_FILTER}
 ORDER BY created_at DESC, run_id
 LIMIT $3"""

LIST_AFTER_SQL = f"""
SELECT {RUN_COLUMNS} FROM awooop_run_state
 WHERE {LIST_FILTER}
   AND created_at <= $9 AND (created_at < $9 OR run_id > $10)
 ORDER BY created_at DESC, run_id
 LIMIT $3"""


@dataclass(frozen=True)
class RunFilter:
    """ListRuns' filters; None means no filter on that column."""

    statuses: list[str] | None = None
    channels: list[str] | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    provider_event_id: str | None = None
    saga_statuses: list[str] | None = None

    def args(self) -> tuple[object, ...]:
        return (self.channels, self.created_after, self.created_before, self.provider_event_id, self.saga_statuses)


# The run's project comes with the events, so one round trip answers and authorizes.
HISTORY_SQL = """
SELECT r.project_id AS run_project, a.created_at, a.action, a.from_status, a.to_status, a.actor, a.reason, a.details
  FROM awooop_run_state r
  LEFT JOIN LATERAL (
        SELECT * FROM awooop_audit_log a WHERE a.run_id = r.run_id ORDER BY a.audit_id LIMIT $2
  ) a ON true
 WHERE r.run_id = $1
 ORDER BY a.audit_id"""


async def get_run(pool: asyncpg.Pool, principal: Principal, run_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(GET_SQL, run_id)
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
) -> tuple[list[asyncpg.Record], str]:
    """A page of runs and the next page's token ('' on the last page)."""
    if after is None:
        rows = await pool.fetch(LIST_FIRST_SQL, project_id, where.statuses, page_size + 1, *where.args())
    else:
        rows = await pool.fetch(
            LIST_AFTER_SQL, project_id, where.statuses, page_size + 1, *where.args(), after[0], after[1]
        )
    if len(rows) <= page_size:
        return list(rows), ""
    page = list(rows[:page_size])
    last = page[-1]
    return page, encode_page_token(last["created_at"], last["run_id"])


async def history(pool: asyncpg.Pool, principal: Principal, run_id: str) -> list[asyncpg.Record]:
    rows = await pool.fetch(HISTORY_SQL, run_id, HISTORY_LIMIT)
    if not rows:
        raise errors.not_found("run", run_id)
    check_run_access(principal, rows[0]["run_project"], ANY_ROLE, run_id)
    return [r for r in rows if r["action"] is not None]
