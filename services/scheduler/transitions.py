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

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.common import errors, retry_policy
from services.common.access import check_run_access, projects_with
from services.common.audit import AUDIT_INSERT
from services.common.auth import Principal
from services.common.db import Row
from services.common.run_options import WAIT_BACKOFF
from services.common.runs import RUN_READY_CHANNEL
from services.common.runstate import (
    CANCELLABLE,
    DROP_LEASE,
    LEASED,
    TRANSITIONS,
    Action,
    Audit,
    RunStatus,
    Transition,
    attempts_left,
    sql_list,
)
from services.common.server_plans import keep_plan
from services.scheduler import metrics, replays
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
    policy_cte: str = "",
) -> str:
    """A fenced write. Parameters: $1 run_id, $2 attempt (fencing token), $3 allowed
    statuses, $4 projects where the caller is a worker (NULL: all), $5 actor; the action's
    own parameters are written by name (`:reason`) and bound after these (fenced_op). In the
    audit expressions the changed row is `upd` (columns of Run plus from_status and prev_worker)."""
    comp = compensation_cte(trigger_sql) if trigger_sql else ""
    comp_audit = comp_audit_rows("$5") if trigger_sql else ""
    notify = notify_cte(f"'{RUN_READY_CHANNEL}'", notify_when) if notify_when else ""
    return f"""
WITH cur AS (
    SELECT {CUR_COLUMNS}
      FROM awooop_run_state
     WHERE run_id = $1
       FOR UPDATE
),{(chr(10) + policy_cte + ",") if policy_cte else ""}
upd AS (
    UPDATE awooop_run_state r
       SET {set_sql}, updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND {fence_where("$2", "$3::text[]", "$4::text[]")} {extra_where}
 RETURNING {RUN_COLUMNS_R}, cur.cur_status AS from_status, cur.cur_worker AS prev_worker
){comp},
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, $5, {action_sql}, from_status, status, {reason_sql},
           {FENCED_AUDIT_DETAILS} || {details_sql}
      FROM upd{comp_audit}
){notify}
SELECT cur.*, upd.*,
       {"(SELECT trigger FROM comp LIMIT 1)" if trigger_sql else "NULL::text"} AS comp_trigger,
       {"(SELECT n FROM notified)" if notify_when else "0::bigint"} AS notified
  FROM cur LEFT JOIN upd ON true
"""


# The failure is retried only when asked, the run's retry policy does not name its error code,
# no cancel is pending, and attempts are left (ReleaseRun hand-backs do not count: attempts
# used = attempt_count - released_count). The policy is merged once per statement (`pol`).
_POLICY = "(SELECT p FROM pol)"
_RETRY = f"""(:retryable AND NOT {retry_policy.non_retryable_sql(_POLICY, "NULLIF(:error_code, '')")}
                AND NOT r.cancel_requested AND {attempts_left("r")})"""
# a delay the caller chose (retry_after), else the policy's for this many attempts used
_DELAY = f"""CASE WHEN :retry_after::float8 > 0 THEN :retry_after::float8
                      ELSE {retry_policy.delay_sql(_POLICY, "r.attempt_count - r.released_count")} END"""


@dataclass(frozen=True)
class FencedOp:
    method: str  # RPC name (metrics label)
    transition: Transition  # runstate: the statuses it may start from, its outcomes and audit actions
    sql: str
    # the action's own parameters, in the order they are bound ($6, $7, ...)
    params: tuple[str, ...]
    # what the refused action was, for INVALID_TRANSITION ("cannot <action> run X in status S");
    # None: the transition's own wording
    describe_cur: Callable[[Row], str] | None = None

    @property
    def allowed(self) -> tuple[str, ...]:
        return self.transition.allowed_from

    def describe(self, cur: Row) -> str:
        return self.describe_cur(cur) if self.describe_cur else self.transition.describe


_FIXED_PARAMS = 5  # fenced_sql's $1..$5
_NAMED = re.compile(r"(?<![:\w]):([a-z_]+)\b")


def bind_names(sql: str, params: tuple[str, ...], first: int) -> str:
    """`:name` placeholders -> `$first`, `$first + 1`, ... in the order of params (every name
    used must be declared, so a parameter can never be bound in the wrong position)."""
    numbers = {name: f"${first + i}" for i, name in enumerate(params)}

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in numbers:
            raise KeyError(f"SQL uses :{m.group(1)}, which is not a declared parameter {params}")
        return numbers[m.group(1)]

    return _NAMED.sub(number, sql)


def fenced_op(method: str, action: Action, *, params: tuple[str, ...] = (), **sql: Any) -> FencedOp:
    """A fenced write of the runstate transition `action`: its statuses, audit actions (unless
    action_sql says otherwise) and the wording of its refusal come from the table."""
    t = TRANSITIONS[action]
    assert t.fenced, action
    describe = sql.pop("describe", None)
    text = fenced_sql(action_sql=sql.pop("action_sql", t.audit_case()), **sql)
    return FencedOp(method, t, keep_plan(bind_names(text, params, _FIXED_PARAMS + 1)), params, describe)


COMPLETE = fenced_op("CompleteRun", Action.COMPLETE, params=("output",), set_sql=complete_set(":output::jsonb"))

FAIL = fenced_op(
    "FailRun",
    Action.FAIL,
    params=("reason", "error_code", "retryable", "retry_after", "policy"),
    set_sql=f"""status = CASE WHEN {_RETRY} THEN 'PENDING'
                         WHEN :retryable AND r.cancel_requested THEN 'CANCELLED'
                         ELSE 'FAILED' END,
           not_before = CASE WHEN {_RETRY} THEN now() + make_interval(secs => {_DELAY}) END,
           wait_reason = CASE WHEN {_RETRY} THEN '{WAIT_BACKOFF}' END,
           {DROP_LEASE}, failure_reason = :reason, error_code = NULLIF(:error_code, '')""",
    reason_sql=":reason",
    details_sql="""jsonb_build_object('retryable', :retryable::boolean, 'error_code', error_code,
                                  'not_before', not_before, 'max_attempts', max_attempts)""",
    trigger_sql="CASE WHEN u.status = 'CANCELLED' THEN 'cancelled' ELSE 'step_failed' END",
    notify_when="status = 'PENDING'",
    policy_cte=f"""pol AS (
    SELECT {retry_policy.effective_sql("cur_project", "r.retry_policy", ":policy")} AS p
      FROM cur JOIN awooop_run_state r ON r.run_id = cur.cur_run_id
)""",
)

RELEASE = fenced_op(
    "ReleaseRun",
    Action.RELEASE,
    params=("reason",),
    # a hand-back while a cancel is pending ends the run: re-queuing would ignore the cancel
    set_sql=f"""status = CASE WHEN r.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END,
           released_count = r.released_count + 1, {DROP_LEASE}, not_before = NULL,
           failure_reason = CASE WHEN r.cancel_requested THEN COALESCE(r.failure_reason, 'cancelled')
                                 ELSE r.failure_reason END""",
    reason_sql="NULLIF(:reason, '')",
    # the mark a repeat of this ReleaseRun finds (replays.released_by)
    details_sql="jsonb_build_object('released', true)",
    trigger_sql="'cancelled'",
    notify_when="status = 'PENDING'",
)

WAIT_TOOL = fenced_op(
    "WaitTool",
    Action.WAIT_TOOL,
    params=("tool_id",),
    set_sql="status = 'WAITING_TOOL'",
    reason_sql="NULLIF(:tool_id, '')",
    details_sql="jsonb_build_object('tool_id', :tool_id::text)",
)

RESUME_TOOL = fenced_op("ResumeTool", Action.RESUME_TOOL, set_sql="status = 'RUNNING'")

ACKNOWLEDGE_CANCEL = fenced_op(
    "AcknowledgeCancel",
    Action.ACKNOWLEDGE_CANCEL,
    set_sql=f"""status = 'CANCELLED', {DROP_LEASE}, not_before = NULL,
           failure_reason = COALESCE(r.failure_reason, 'cancelled'), error_code = NULL""",
    reason_sql="'cancel acknowledged by the worker'",
    extra_where="AND r.cancel_requested",
    trigger_sql="'cancelled'",
    describe=lambda cur: "acknowledge a cancel" if cur["cur_cancel"] else "acknowledge an unrequested cancel of",
)

# repeats recognised by the run's state and this attempt's audit row (replays.wrote); a
# RequestApproval repeat needs a new token instead (approvals.py)
REPLAYED_FROM_AUDIT = (WAIT_TOOL, RESUME_TOOL, ACKNOWLEDGE_CANCEL)


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
    *,
    saga: SagaNudger,
    **params: Any,
) -> Changed:
    """Runs a fenced write with the op's own parameters by name; raises NOT_FOUND /
    PERMISSION_DENIED / LEASE_LOST / INVALID_TRANSITION when it changed nothing."""
    if set(params) != set(op.params):
        raise TypeError(f"{op.method} takes {op.params}, got {tuple(params)}")
    row = await pool.fetchrow(
        op.sql,
        run_id,
        attempt,
        list(op.allowed),
        projects_with(principal, WORKER_ROLE),
        principal.actor,
        *(params[name] for name in op.params),
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
    """The same success again when this lease's earlier write of op committed (replays.py)."""
    if op is COMPLETE:
        done = replays.completed_by(cur, attempt)
    elif op is FAIL:
        done = await replays.failed_by(pool, cur, run_id, attempt)
    elif op is RELEASE:
        done = await replays.released_by(pool, cur, run_id, attempt)
    elif op in REPLAYED_FROM_AUDIT:
        done = await replays.wrote(pool, cur, run_id, attempt, op.transition.action)
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

# Queued and waiting runs (parked ones too) end at once; a leased run gets cancel_requested (delivered in the
# Heartbeat reply) and ends when its worker acknowledges or its lease is reaped.
# $1 run_id, $2 projects where the caller may cancel (NULL: all), $3 actor, $4 reason.
CANCEL_SQL = f"""
WITH cur AS (
    SELECT run_id AS cur_run_id, project_id AS cur_project, status AS cur_status,
           -- a run parked on a durable wait is WAITING_TOOL without a worker: no heartbeat would
           -- deliver a cancel request, so it ends at once like a queued run
           status IN ({sql_list(LEASED)}) AND worker_id IS NOT NULL AS leased
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
       AND cur.cur_status IN ({sql_list(CANCELLABLE)})
       AND ($2::text[] IS NULL OR r.project_id = ANY($2::text[]))
 RETURNING {RUN_COLUMNS_R}, cur.cur_status AS from_status
){compensation_cte("'cancelled'")},
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, $3,
           CASE status WHEN '{RunStatus.CANCELLED}' THEN '{Audit.CANCELLED}' ELSE '{Audit.CANCEL_REQUESTED}' END,
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
        if await replays.cancelled_by(pool, row, run_id, principal.actor):  # a repeat: the same success
            current = (await replays.current_rows(pool, [run_id]))[run_id]
            return Changed(current, current["comp_trigger"])
        raise errors.invalid_transition(run_id, row["cur_status"], TRANSITIONS[Action.CANCEL].describe)
    return settled(row, saga)
