"""RedriveRuns: an operator requeues a project's FAILED runs matching a filter (error code, time
of failure), each with fresh attempts, as one statement: the runs (runstate Action.REDRIVE), a
REDRIVEN audit row per run, one RUNS_REDRIVEN row for the action with its filter, and the
wake-up NOTIFY.

Fresh attempts keep the fencing token growing: released_count is raised to attempt_count, so
the attempts used (attempt_count - released_count) start again from 0. A run with a recorded
compensation request (its steps were or are being undone) is never requeued.
"""

from __future__ import annotations

import datetime as dt

import asyncpg

from services.common.audit import AUDIT_INSERT
from services.common.runs import RUN_READY_CHANNEL
from services.common.runstate import TRANSITIONS, Action, Audit, RunStatus, sql_list

RUNS_REDRIVEN = "RUNS_REDRIVEN"  # the operator action's audit row (run_id NULL)
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000

_T = TRANSITIONS[Action.REDRIVE]

# $1 project, $2 error code (NULL: any), $3 failed at or after, $4 failed before, $5 limit,
# $6 actor, $7 reason
REDRIVE_SQL = f"""
WITH picked AS (
    SELECT run_id, status
      FROM awooop_run_state r
     WHERE project_id = $1::text AND status IN ({sql_list(_T.allowed_from)})
       AND ($2::text IS NULL OR error_code = $2::text)
       AND ($3::timestamptz IS NULL OR updated_at >= $3::timestamptz)
       AND ($4::timestamptz IS NULL OR updated_at < $4::timestamptz)
       AND NOT EXISTS (SELECT 1 FROM awooop_compensation_request c WHERE c.run_id = r.run_id)
     ORDER BY updated_at
     LIMIT $5
       FOR UPDATE SKIP LOCKED
),
upd AS (
    UPDATE awooop_run_state r
       SET status = '{RunStatus.PENDING}', released_count = r.attempt_count, failure_reason = NULL,
           error_code = NULL, not_before = NULL, wait_reason = NULL, cancel_requested = false,
           lease_until = NULL, worker_id = NULL, updated_at = now()
      FROM picked p
     WHERE r.run_id = p.run_id
 RETURNING r.run_id, r.project_id, r.attempt_count, p.status AS from_status
),
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, $6, '{Audit.REDRIVEN}', from_status, '{RunStatus.PENDING}', NULLIF($7, ''),
           jsonb_build_object('attempt', attempt_count)
      FROM upd
    UNION ALL
    SELECT $1::text, NULL, $6, '{RUNS_REDRIVEN}', NULL, NULL, NULLIF($7, ''),
           jsonb_build_object('count', (SELECT count(*) FROM upd), 'error_code', $2::text,
                              'failed_after', $3::timestamptz, 'failed_before', $4::timestamptz, 'limit', $5::int)
),
notified AS (
    SELECT count(pg_notify('{RUN_READY_CHANNEL}', $1::text)) AS n FROM (SELECT 1 FROM upd LIMIT 1) x
)
SELECT upd.run_id, (SELECT n FROM notified) AS notified FROM upd
"""


async def redrive(
    pool: asyncpg.Pool,
    project_id: str,
    *,
    error_code: str | None,
    failed_after: dt.datetime | None,
    failed_before: dt.datetime | None,
    limit: int,
    actor: str,
    reason: str,
) -> list[str]:
    rows = await pool.fetch(REDRIVE_SQL, project_id, error_code, failed_after, failed_before, limit, actor, reason)
    return [str(r["run_id"]) for r in rows]
