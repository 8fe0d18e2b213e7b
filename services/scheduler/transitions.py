"""Fenced worker writes (CompleteRun, FailRun, ReleaseRun, WaitTool, ResumeTool,
AcknowledgeCancel; RequestApproval lives in approvals.py) and CancelRun.

Each is ONE statement: lock the row (`cur`), change it only if the fencing token and the
status allow (`upd`), and in the same statement write the audit row, record a compensation
request and NOTIFY waiting claimers. The statement always returns the locked row's current
state too, so when nothing changed the error is chosen without a second round trip.

A lease is held until the reaper takes it, not until lease_until passes: a write that
arrives after lease_until but before the reaper's statement still counts. The reaper and
the write serialize on the row lock, and the fencing token keeps any later attempt safe.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.common import errors
from services.common.auth import Principal
from services.common.runs import RUN_READY_CHANNEL
from services.scheduler import metrics, replays
from services.scheduler.access import check_run_access, projects_with
from services.scheduler.fragments import (
    CUR_COLUMNS,
    FENCED_AUDIT_DETAILS,
    RUN_COLUMNS_R,
    comp_audit_rows,
    compensation_cte,
    complete_set,
    fence_where,
    fenced_refusal,
    notify_cte,
)
from services.scheduler.saga_client import SagaNudger

WORKER_ROLE = "worker"
# CancelRun: people deciding about runs (approver), the service that created them from a
# channel (ingest: a user's "cancel" arrives through it), and admin. Workers end their own
# runs with FailRun instead.
CANCEL_ROLES = ("admin", "approver", "ingest")


def fenced_sql(
    *,
    set_sql: str,
    action_sql: str,
    reason_sql: str = "NULL",
    details_sql: str = "'{}'::jsonb",
    extra_where: str = "",
    trigger_sql: str | None = None,
    notify_when: str | None = None,
) -> str:
    """A fenced write. Parameters: $1 run_id, $2 attempt (fencing token), $3 allowed
    statuses, $4 projects where the caller is a worker (NULL: all), $5 actor, $6... the
    action's own. In the audit expressions the changed row is `upd` (columns of Run plus
    from_status and prev_worker)."""
    comp = compensation_cte(trigger_sql) if trigger_sql else ""
    comp_audit = comp_audit_rows("$5") if trigger_sql else ""
    notify = notify_cte(f"'{RUN_READY_CHANNEL}'", notify_when) if notify_when else ""
    return f"""
WITH cur AS (
    SELECT {CUR_COLUMNS}
      FROM awooop_run_state
     WHERE run_id = $1
       FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET {set_sql}, updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND {fence_where("$2", "$3::text[]", "$4::text[]")} {extra_where}
 RETURNING {RUN_COLUMNS_R}, cur.cur_status AS from_status, cur.cur_worker AS prev_worker
){comp},
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, $5, {action_sql}, from_status, status, {reason_sql},
           {FENCED_AUDIT_DETAILS} || {details_sql}
      FROM upd{comp_audit}
){notify}
SELECT cur.*, upd.*,
       {"(SELECT trigger FROM comp LIMIT 1)" if trigger_sql else "NULL::text"} AS comp_trigger,
       {"(SELECT n FROM notified)" if notify_when else "0::bigint"} AS notified
  FROM cur LEFT JOIN upd ON true
"""


# The failure is retried only when asked, no cancel is pending, and attempts are left
# (ReleaseRun hand-backs do not count: attempts used = attempt_count - released_count).
_RETRY = "($8 AND NOT r.cancel_requested AND r.attempt_count - r.released_count < r.max_attempts)"


@dataclass(frozen=True)
class FencedOp:
    method: str  # RPC name (metrics label)
    sql: str
    allowed: tuple[str, ...]  # statuses the action may start from
    # what the refused action was, for INVALID_TRANSITION ("cannot <action> run X in status S")
    describe: Callable[[Mapping[str, Any]], str]


COMPLETE = FencedOp(
    "CompleteRun",
    fenced_sql(
        set_sql=complete_set("$6::jsonb"),
        action_sql="'COMPLETED'",
    ),
    ("RUNNING",),
    lambda cur: "complete",
)

FAIL = FencedOp(
    "FailRun",
    fenced_sql(
        set_sql=f"""status = CASE WHEN {_RETRY} THEN 'PENDING'
                         WHEN $8 AND r.cancel_requested THEN 'CANCELLED'
                         ELSE 'FAILED' END,
           not_before = CASE WHEN {_RETRY} THEN now() + make_interval(secs => $9) END,
           lease_until = NULL, worker_id = NULL, failure_reason = $6, error_code = NULLIF($7, '')""",
        action_sql="CASE status WHEN 'PENDING' THEN 'RETRY_SCHEDULED' WHEN 'CANCELLED' THEN 'CANCELLED' "
        "ELSE 'FAILED' END",
        reason_sql="$6",
        details_sql="""jsonb_build_object('retryable', $8::boolean, 'error_code', error_code,
                                  'not_before', not_before, 'max_attempts', max_attempts)""",
        trigger_sql="CASE WHEN u.status = 'CANCELLED' THEN 'cancelled' ELSE 'step_failed' END",
        notify_when="status = 'PENDING'",
    ),
    ("RUNNING", "WAITING_TOOL"),
    lambda cur: "fail",
)

RELEASE = FencedOp(
    "ReleaseRun",
    fenced_sql(
        # a hand-back while a cancel is pending ends the run: re-queuing would ignore the cancel
        set_sql="""status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END,
           released_count = r.released_count + 1, lease_until = NULL, worker_id = NULL, not_before = NULL,
           failure_reason = CASE WHEN r.cancel_requested THEN COALESCE(r.failure_reason, 'cancelled')
                                 ELSE r.failure_reason END""",
        action_sql="CASE status WHEN 'CANCELLED' THEN 'CANCELLED' ELSE 'RELEASED' END",
        reason_sql="NULLIF($6, '')",
        trigger_sql="'cancelled'",
        notify_when="status = 'PENDING'",
    ),
    ("RUNNING", "WAITING_TOOL"),
    lambda cur: "release",
)

WAIT_TOOL = FencedOp(
    "WaitTool",
    fenced_sql(
        set_sql="status = 'WAITING_TOOL'",
        action_sql="'WAITING_TOOL'",
        reason_sql="NULLIF($6, '')",
        details_sql="jsonb_build_object('tool_id', $6::text)",
    ),
    ("RUNNING",),
    lambda cur: "wait for a tool on",
)

RESUME_TOOL = FencedOp(
    "ResumeTool",
    fenced_sql(set_sql="status = 'RUNNING'", action_sql="'TOOL_RETURNED'"),
    ("WAITING_TOOL",),
    lambda cur: "resume from a tool wait",
)

ACKNOWLEDGE_CANCEL = FencedOp(
    "AcknowledgeCancel",
    fenced_sql(
        set_sql="""status = 'CANCELLED', lease_until = NULL, worker_id = NULL, not_before = NULL,
           failure_reason = COALESCE(r.failure_reason, 'cancelled'), error_code = NULL""",
        action_sql="'CANCELLED'",
        reason_sql="'cancel acknowledged by the worker'",
        extra_where="AND r.cancel_requested",
        trigger_sql="'cancelled'",
    ),
    ("RUNNING", "WAITING_TOOL"),
    lambda cur: "acknowledge a cancel" if cur["cur_cancel"] else "acknowledge an unrequested cancel of",
)


@dataclass(frozen=True)
class Changed:
    row: asyncpg.Record
    compensation_trigger: str | None

    @property
    def compensation_requested(self) -> bool:
        return self.compensation_trigger is not None


async def fenced_write(
    pool: asyncpg.Pool,
    op: FencedOp,
    principal: Principal,
    run_id: str,
    attempt: int,
    *args: Any,
    saga: SagaNudger,
) -> Changed:
    """Runs a fenced write; raises NOT_FOUND / PERMISSION_DENIED / LEASE_LOST / INVALID_TRANSITION
    when it changed nothing."""
    row = await pool.fetchrow(
        op.sql, run_id, attempt, list(op.allowed), projects_with(principal, WORKER_ROLE), principal.actor, *args
    )
    if row is None:
        raise errors.not_found("run", run_id)
    if row["run_id"] is None:
        check_run_access(principal, row["cur_project"], WORKER_ROLE, run_id)
        replay = await _replayed(pool, op, row, run_id, attempt)
        if replay is not None:
            return replay
        err = fenced_refusal(row, run_id, attempt, op.describe(row))
        if err.reason == errors.LEASE_LOST:
            metrics.LEASE_LOST.labels(op.method).inc()
        raise err
    return settled(row, saga)


async def _replayed(pool: asyncpg.Pool, op: FencedOp, cur: asyncpg.Record, run_id: str, attempt: int) -> Changed | None:
    """The same success again when this lease's earlier CompleteRun / FailRun committed."""
    if op is COMPLETE:
        done = replays.completed_by(cur, attempt)
    elif op is FAIL:
        done = await replays.failed_by(pool, cur, run_id, attempt)
    else:
        return None
    if not done:
        return None
    row = (await replays.current_rows(pool, [run_id])).get(run_id)
    return None if row is None else Changed(row, row["comp_trigger"])


def settled(row: asyncpg.Record, saga: SagaNudger) -> Changed:
    """Counts a change and nudges the saga service when a compensation was recorded."""
    metrics.TRANSITIONS.labels(row["status"]).inc()
    trigger = row["comp_trigger"]
    if trigger:
        metrics.COMPENSATIONS.labels(trigger).inc()
        saga.nudge(str(row["run_id"]), trigger, row["failure_reason"] or "")
    return Changed(row, trigger)


# --- CancelRun -----------------------------------------------------------------------------

# Queued and waiting runs end at once; a leased run gets cancel_requested (delivered in the
# Heartbeat reply) and ends when its worker acknowledges or its lease is reaped.
# $1 run_id, $2 projects where the caller may cancel (NULL: all), $3 actor, $4 reason.
CANCEL_SQL = f"""
WITH cur AS (
    SELECT run_id AS cur_run_id, project_id AS cur_project, status AS cur_status,
           status IN ('RUNNING', 'WAITING_TOOL') AS leased
      FROM awooop_run_state
     WHERE run_id = $1
       FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET status = CASE WHEN cur.leased THEN r.status ELSE 'CANCELLED' END,
           cancel_requested = cur.leased OR r.cancel_requested,
           lease_until = CASE WHEN cur.leased THEN r.lease_until END,
           worker_id = CASE WHEN cur.leased THEN r.worker_id END,
           error_code = CASE WHEN cur.leased THEN r.error_code END,
           failure_reason = $4,
           approval_token_hash = NULL,
           not_before = NULL,
           updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND cur.cur_status IN ('PENDING', 'RESUMED', 'WAITING_APPROVAL', 'RUNNING', 'WAITING_TOOL')
       AND ($2::text[] IS NULL OR r.project_id = ANY($2::text[]))
 RETURNING {RUN_COLUMNS_R}, cur.cur_status AS from_status
){compensation_cte("'cancelled'")},
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, $3, CASE status WHEN 'CANCELLED' THEN 'CANCELLED' ELSE 'CANCEL_REQUESTED' END,
           from_status, status, $4, jsonb_build_object('attempt', attempt_count, 'worker_id', worker_id)
      FROM upd{comp_audit_rows("$3")}
)
SELECT cur.*, upd.*, (SELECT trigger FROM comp LIMIT 1) AS comp_trigger
  FROM cur LEFT JOIN upd ON true
"""


async def cancel(pool: asyncpg.Pool, principal: Principal, run_id: str, reason: str, *, saga: SagaNudger) -> Changed:
    reason = reason or f"cancelled by {principal.actor}"
    row = await pool.fetchrow(CANCEL_SQL, run_id, projects_with(principal, CANCEL_ROLES), principal.actor, reason)
    if row is None:
        raise errors.not_found("run", run_id)
    if row["run_id"] is None:
        check_run_access(principal, row["cur_project"], CANCEL_ROLES, run_id)
        raise errors.invalid_transition(run_id, row["cur_status"], "cancel")
    return settled(row, saga)
