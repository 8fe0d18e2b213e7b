"""Approvals (seed 000 D4): RUNNING -> WAITING_APPROVAL releases
the lease and issues a token (random, returned once, stored as sha256 only, single use,
15 min by default; the same lease asking again, its first answer lost, gets a new token in place
of the old). Approve: RESUMED (claimable again, new fencing token). Reject: FAILED
with E-APPROVAL-REJECTED. Expiry: FAILED with E-APPROVAL-002, by the sweep or by the
DecideApproval call that finds it expired, whichever comes first. Rejection and expiry
record a compensation request when the journal has something to undo, and end the journal's
pending approval step `failed` with the decision and who made it.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid

import asyncpg

from services.common import errors, loops
from services.common.access import check_run_access, projects_with
from services.common.audit import AUDIT_INSERT
from services.common.auth import Principal
from services.common.runs import RUN_COLUMNS, RUN_READY_CHANNEL
from services.common.runstate import DROP_LEASE, TRANSITIONS, Action, Audit, RunStatus, sql_list
from services.scheduler import metrics, replays
from services.scheduler.fragments import RUN_COLUMNS_R, comp_audit_rows, compensation_cte, notify_cte
from services.scheduler.saga_client import SagaNudger
from services.scheduler.transitions import WORKER_ROLE, Changed, fenced_op, fenced_write, settled

APPROVER_ROLE = "approver"
EXPIRED_CODE = "E-APPROVAL-002"  # seed 000 D4
REJECTED_CODE = "E-APPROVAL-REJECTED"
EXPIRED_REASON = "approval token expired"
SWEEP_LOOP = "scheduler.approval_sweep"
SWEEP_ACTOR = "system:approval-sweep"
SWEEP_BATCH = 500


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def new_token() -> tuple[str, bytes]:
    # never starting with '-': an operator pastes it after `--token`, where argparse (and most
    # command lines) would take it for an option (1 in 64 url-safe tokens did)
    token = secrets.token_urlsafe(32)
    while token.startswith("-"):
        token = secrets.token_urlsafe(32)
    return token, token_hash(token)


# The hand-back does not count as a used attempt
# (released_count), so a run may ask for approval without spending its max_attempts.
REQUEST = fenced_op(
    "RequestApproval",
    Action.REQUEST_APPROVAL,
    params=("token_hash", "ttl", "summary"),
    set_sql=f"""status = 'WAITING_APPROVAL', {DROP_LEASE},
           released_count = r.released_count + 1,
           approval_token_hash = :token_hash, approval_expires_at = now() + make_interval(secs => :ttl),
           approval_summary = :summary, approval_decided_by = NULL, approval_decided_at = NULL""",
    reason_sql="NULLIF(:summary, '')",
    details_sql="jsonb_build_object('expires_at', approval_expires_at)",
    # a run whose cancel is pending must not park itself where the cancel cannot reach it
    extra_where="AND NOT r.cancel_requested",
    describe=lambda cur: (
        "request approval while a cancel is pending for" if cur["cur_cancel"] else "request approval of"
    ),
)


# A RequestApproval repeated by the same lease after its first call committed: the answer, the
# only copy of the token, was lost (a dropped connection, a timeout), and the run waits for an
# approval nobody can give. WAITING_APPROVAL with this attempt can only be this lease's request
# (a decision ends the wait, and the next claim is another attempt), so a new token replaces the
# one never seen; expiry and summary stay. $1 run_id, $2 attempt, $3 sha256(new token),
# $4 projects where the caller is a worker (NULL: all), $5 actor.
REQUEST_REPEATS = REQUEST.transition.replays_from
REISSUE_SQL = f"""
WITH upd AS (
    UPDATE awooop_run_state r
       SET approval_token_hash = $3, updated_at = now()
     WHERE r.run_id = $1 AND r.attempt_count = $2 AND r.status IN ({sql_list(REQUEST_REPEATS)})
       AND ($4::text[] IS NULL OR r.project_id = ANY($4::text[]))
 RETURNING {RUN_COLUMNS_R}
),
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, $5, '{Audit.APPROVAL_TOKEN_REISSUED}', status, status,
           'RequestApproval repeated by the same lease', jsonb_build_object('attempt', attempt_count)
      FROM upd
)
SELECT upd.*, NULL::text AS comp_trigger FROM upd
"""


async def request(
    pool: asyncpg.Pool,
    principal: Principal,
    run_id: str,
    attempt: int,
    summary: str,
    ttl: float,
    *,
    saga: SagaNudger,
) -> tuple[Changed, str]:
    """Returns the change and the token (the only time it exists outside a hash)."""
    token, digest = new_token()
    try:
        changed = await fenced_write(
            pool, REQUEST, principal, run_id, attempt, saga=saga, token_hash=digest, ttl=ttl, summary=summary
        )
    except errors.ServiceError as refused:
        if refused.reason != errors.INVALID_TRANSITION or refused.metadata.get("status") not in REQUEST_REPEATS:
            raise
        row = await pool.fetchrow(
            REISSUE_SQL, run_id, attempt, digest, projects_with(principal, WORKER_ROLE), principal.actor
        )
        if row is None:  # another attempt's approval: the refusal stands
            raise
        changed = Changed(row, None)
    return changed, token


def approval_step_cte(expired_sql: str, decided_by_sql: str, reason_sql: str) -> str:
    """CTE `approval_step`: the journal's pending approval_request step of each run of `upd` that
    the decision failed ends `failed`, with the decision and who made it, so the journal does not
    show an approval still pending on a run that is over. The SQL arguments are evaluated per row
    of `upd` aliased `u` (expired_sql: true for an expiry, false for a rejection). An approval is
    completed by the worker that resumes (the SDK does it), since only it runs on."""
    return f""",
approval_step AS (
    UPDATE awooop_saga_step s
       SET status = 'failed', completed_at = now(),
           error = CASE WHEN {expired_sql} THEN 'approval expired ({EXPIRED_CODE})'
                        ELSE 'rejected by ' || {decided_by_sql} || COALESCE(': ' || NULLIF({reason_sql}, ''), '') END,
           result = jsonb_build_object(
               'approved', false,
               'decision', CASE WHEN {expired_sql} THEN 'expired' ELSE 'rejected' END,
               'decided_by', CASE WHEN {expired_sql} THEN NULL ELSE {decided_by_sql} END,
               'reason', CASE WHEN {expired_sql} THEN '{EXPIRED_REASON}' ELSE NULLIF({reason_sql}, '') END)
      FROM upd u
     WHERE s.run_id = u.run_id AND u.status = 'FAILED'
       AND s.step_type = 'approval_request' AND s.status = 'pending'
)"""


# One statement decides or, when the token expired, fails the run with E-APPROVAL-002 (so the
# caller's answer and the stored state agree even before the sweep runs). The token is single
# use: only a WAITING_APPROVAL run is decided, and the next request replaces its hash. The hash
# of a decided token stays, so the same approver's repeat of the decision (its first answer lost)
# is recognised: `cur` says whether the token and the approver are the ones that decided.
# $1 run_id, $2 projects where the caller is approver, $3 actor, $4 sha256(token), $5 approve,
# $6 reason, $7 principal id.
DECIDE_SQL = f"""
WITH cur AS (
    SELECT run_id AS cur_run_id, project_id AS cur_project, status AS cur_status,
           error_code AS cur_error_code,
           COALESCE(approval_expires_at <= now(), false) AS expired,
           approval_token_hash IS NOT DISTINCT FROM $4 AND approval_decided_by IS NOT DISTINCT FROM $7
               AS decided_by_caller
      FROM awooop_run_state
     WHERE run_id = $1
       FOR UPDATE
),
upd AS (
    UPDATE awooop_run_state r
       SET status = CASE WHEN cur.expired OR NOT $5 THEN 'FAILED' ELSE 'RESUMED' END,
           error_code = CASE WHEN cur.expired THEN '{EXPIRED_CODE}'
                             WHEN NOT $5 THEN '{REJECTED_CODE}' ELSE r.error_code END,
           failure_reason = CASE WHEN cur.expired THEN '{EXPIRED_REASON}'
                                 WHEN NOT $5 THEN $6 ELSE r.failure_reason END,
           approval_token_hash = CASE WHEN cur.expired THEN NULL ELSE r.approval_token_hash END,
           approval_decided_by = CASE WHEN cur.expired THEN NULL ELSE $7 END,
           approval_decided_at = CASE WHEN cur.expired THEN NULL ELSE now() END,
           updated_at = now()
      FROM cur
     WHERE r.run_id = cur.cur_run_id
       AND r.status = 'WAITING_APPROVAL'
       AND (cur.expired OR r.approval_token_hash = $4)
       AND ($2::text[] IS NULL OR r.project_id = ANY($2::text[]))
 RETURNING {RUN_COLUMNS_R}, cur.expired
){compensation_cte("CASE WHEN u.expired THEN 'approval_expired' ELSE 'approval_rejected' END")}{
    approval_step_cte("u.expired", "$7::text", "$6::text")
},
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, $3,
           CASE WHEN expired THEN '{Audit.APPROVAL_EXPIRED}' WHEN status = '{RunStatus.RESUMED}' THEN '{Audit.APPROVED}'
                ELSE '{Audit.APPROVAL_REJECTED}' END,
           '{RunStatus.WAITING_APPROVAL}', status, CASE WHEN expired THEN '{EXPIRED_REASON}' ELSE NULLIF($6, '') END,
           jsonb_build_object('attempt', attempt_count, 'error_code', error_code)
      FROM upd{comp_audit_rows("$3")}
){notify_cte(f"'{RUN_READY_CHANNEL}'", "status = 'RESUMED'")}
SELECT cur.*, upd.*, (SELECT trigger FROM comp LIMIT 1) AS comp_trigger, (SELECT n FROM notified) AS notified
  FROM cur LEFT JOIN upd ON true
"""


async def decide(
    pool: asyncpg.Pool,
    principal: Principal,
    run_id: str,
    token: str,
    approve: bool,
    reason: str,
    *,
    saga: SagaNudger,
) -> Changed:
    digest = token_hash(token)
    reason = reason or ("approved" if approve else "approval rejected")
    row = await pool.fetchrow(
        DECIDE_SQL,
        run_id,
        projects_with(principal, APPROVER_ROLE),
        principal.actor,
        digest,
        approve,
        reason,
        principal.principal_id,
    )
    if row is None:
        raise errors.not_found("run", run_id)
    if row["run_id"] is not None:
        changed = settled(row, saga)
        if row["expired"]:  # the expiry is committed; the decision came too late
            metrics.APPROVALS_EXPIRED.inc()
            raise errors.approval_expired(run_id)
        return changed
    check_run_access(principal, row["cur_project"], APPROVER_ROLE, run_id)
    if row["decided_by_caller"] and _left_by(row, approve):
        # this approver's same decision with this token committed (its answer lost): the same
        # success again, nothing written or nudged again
        current = (await replays.current_rows(pool, [run_id]))[run_id]
        return Changed(current, current["comp_trigger"])
    raise _refusal(principal, run_id, row["cur_project"], row["cur_status"], row["cur_error_code"], expired=False)


def _refusal(
    principal: Principal, run_id: str, project: str | None, status: str, error_code: str | None, *, expired: bool
) -> errors.ServiceError:
    """Why a decision with this token would not (or did not) go through: the one rule for
    DecideApproval and its validate_only check. Raises NOT_FOUND / PERMISSION_DENIED itself."""
    check_run_access(principal, project, APPROVER_ROLE, run_id)
    if status != "WAITING_APPROVAL":
        if status == "FAILED" and error_code == EXPIRED_CODE:
            return errors.approval_expired(run_id)
        return errors.invalid_transition(run_id, status, TRANSITIONS[Action.APPROVE].describe)
    if expired:
        return errors.approval_expired(run_id)
    # waiting, not expired, and the caller may decide: the token is wrong or already used.
    # (The comparison happens in SQL on sha256 digests; the stored hash is never read back.)
    return errors.approval_invalid(run_id)


# DecideApproval with validate_only: the run and what a decision would find, nothing written.
# $1 run_id, $2 sha256(token).
CHECK_SQL = f"""
SELECT {RUN_COLUMNS}, COALESCE(approval_expires_at <= now(), false) AS expired,
       COALESCE(approval_token_hash = $2, false) AS token_matches
  FROM awooop_run_state
 WHERE run_id = $1"""


async def check(pool: asyncpg.Pool, principal: Principal, run_id: str, token: str) -> asyncpg.Record:
    """The run, when this caller could decide it with this token now; else the error a decision
    would answer (an expired token is reported, not committed: the sweep or a decision does that)."""
    row = await pool.fetchrow(CHECK_SQL, run_id, token_hash(token))
    if row is None:
        raise errors.not_found("run", run_id)
    if row["status"] == "WAITING_APPROVAL" and not row["expired"] and row["token_matches"]:
        check_run_access(principal, row["project_id"], APPROVER_ROLE, run_id)
        return row
    raise _refusal(principal, run_id, row["project_id"], row["status"], row["error_code"], expired=row["expired"])


def _left_by(cur: asyncpg.Record, approve: bool) -> bool:
    """The run is still where the decision left it (RESUMED, or FAILED as rejected); once it
    moved on (claimed, cancelled), a repeat is refused as any late decision is."""
    if approve:
        return bool(cur["cur_status"] == TRANSITIONS[Action.APPROVE].to_states[0])
    return bool(cur["cur_status"] == TRANSITIONS[Action.REJECT].to_states[0] and cur["cur_error_code"] == REJECTED_CODE)


# --- the expiry sweep ------------------------------------------------------------------------

# SKIP LOCKED batches, so several scheduler replicas sweep without waiting on each other.
# $1 batch size, $2 actor, $3 one run only (NULL: any; the pass's fallback when a batch failed for
# one run's data).
SWEEP_SQL = f"""
WITH due AS (
    SELECT run_id
      FROM awooop_run_state
     WHERE status = 'WAITING_APPROVAL' AND approval_expires_at <= now() AND ($3::uuid IS NULL OR run_id = $3)
     ORDER BY approval_expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'FAILED', error_code = '{EXPIRED_CODE}', failure_reason = '{EXPIRED_REASON}',
           approval_token_hash = NULL, updated_at = now()
      FROM due
     WHERE r.run_id = due.run_id AND r.status = 'WAITING_APPROVAL' AND r.approval_expires_at <= now()
 RETURNING r.run_id, r.project_id, r.status, r.failure_reason, r.attempt_count, r.approval_expires_at
){compensation_cte("'approval_expired'")}{approval_step_cte("true", "NULL::text", "NULL::text")},
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, $2, '{Audit.APPROVAL_EXPIRED}', '{RunStatus.WAITING_APPROVAL}', '{RunStatus.FAILED}',
           '{EXPIRED_REASON}',
           jsonb_build_object('attempt', attempt_count, 'error_code', '{EXPIRED_CODE}',
                              'expired_at', approval_expires_at)
      FROM upd{comp_audit_rows("$2")}
)
SELECT upd.run_id, upd.failure_reason, comp.trigger
  FROM upd LEFT JOIN comp USING (run_id)
"""


# the runs a sweep batch would take, for expiring them one at a time
DUE_SQL = """
SELECT run_id FROM awooop_run_state
 WHERE status = 'WAITING_APPROVAL' AND approval_expires_at <= now()
 ORDER BY approval_expires_at
 LIMIT $1
"""


async def expire_approvals(pool: asyncpg.Pool, saga: SagaNudger, batch: int = SWEEP_BATCH) -> int:
    """One sweep: fails every expired approval (in batches); returns how many. A batch that
    fails for one run's data is swept again one run at a time (that run skipped and noted)."""
    settled: list[int] = []

    async def statement(only: uuid.UUID | None, size: int) -> list[asyncpg.Record]:
        return await pool.fetch(SWEEP_SQL, size, SWEEP_ACTOR, only)

    await loops.in_batches(
        SWEEP_LOOP, SWEEP_ACTOR, pool, batch, statement, DUE_SQL, lambda rows: settled.append(_settle(rows, saga))
    )
    return sum(settled)


def _settle(rows: list[asyncpg.Record], saga: SagaNudger) -> int:
    metrics.APPROVALS_EXPIRED.inc(len(rows))
    for r in rows:
        if r["trigger"]:
            metrics.COMPENSATIONS.labels(r["trigger"]).inc()
            saga.nudge(str(r["run_id"]), r["trigger"], r["failure_reason"] or "")
    return len(rows)
