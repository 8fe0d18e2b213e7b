"""Approvals (seed 000 D4): RUNNING -> WAITING_APPROVAL releases
the lease and issues a token (random, returned once, stored as sha256 only, single use,
15 min by default; the same lease asking again, its first answer lost, gets a new token in place
of the old). Approve: RESUMED (claimable again, new fencing token). Reject: FAILED
with E-APPROVAL-REJECTED. Expiry: FAILED with E-APPROVAL-002, by the sweep or by the
DecideApproval call that finds it expired, whichever comes first. Rejection and expiry
record a compensation request when the journal has something to undo, and end the journal's
pending approval step `failed` with the decision and who made it. The statements are in
approvals.sql.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid

import asyncpg

from services.common import errors, loops
from services.common.access import check_run_access, projects_with
from services.common.auth import Principal
from services.common.db import Row
from services.common.runstate import TRANSITIONS, Action, RunStatus
from services.scheduler import approvals_sql, metrics, replays
from services.scheduler.saga_client import SagaNudger
from services.scheduler.transitions import WORKER_ROLE, Changed, fenced_op, fenced_write, settled

APPROVER_ROLE = "approver"
# as approvals.sql writes them (DecideApproval, ExpireApprovals); the refusals read them back
EXPIRED_CODE = "E-APPROVAL-002"  # seed 000 D4
REJECTED_CODE = "E-APPROVAL-REJECTED"
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


REQUEST = fenced_op(
    "RequestApproval",
    Action.REQUEST_APPROVAL,
    approvals_sql.REQUEST_APPROVAL,
    approvals_sql.request_approval,
    lambda cur: "request approval while a cancel is pending for" if cur["cur_cancel"] else "request approval of",
)
# a repeat of RequestApproval by the same lease gets a new token (approvals.sql ReissueApprovalToken)
REQUEST_REPEATS = REQUEST.transition.replays_from


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
        row = await approvals_sql.reissue_approval_token(
            pool,
            run_id=run_id,
            attempt=attempt,
            token_hash=digest,
            worker_projects=projects_with(principal, WORKER_ROLE),
            actor=principal.actor,
        )
        if row is None:  # another attempt's approval: the refusal stands
            raise
        changed = Changed(row, None)
    return changed, token


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
    row = await approvals_sql.decide_approval(
        pool,
        run_id=run_id,
        approver_projects=projects_with(principal, APPROVER_ROLE),
        actor=principal.actor,
        token_hash=digest,
        approve=approve,
        reason=reason,
        decided_by=principal.principal_id,
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
    if status != RunStatus.WAITING_APPROVAL:
        if status == RunStatus.FAILED and error_code == EXPIRED_CODE:
            return errors.approval_expired(run_id)
        return errors.invalid_transition(run_id, status, TRANSITIONS[Action.APPROVE].describe)
    if expired:
        return errors.approval_expired(run_id)
    # waiting, not expired, and the caller may decide: the token is wrong or already used.
    # (The comparison happens in SQL on sha256 digests; the stored hash is never read back.)
    return errors.approval_invalid(run_id)


async def check(pool: asyncpg.Pool, principal: Principal, run_id: str, token: str) -> approvals_sql.CheckApprovalRow:
    """The run, when this caller could decide it with this token now; else the error a decision
    would answer (an expired token is reported, not committed: the sweep or a decision does that)."""
    row = await approvals_sql.check_approval(pool, run_id=run_id, token_hash=token_hash(token))
    if row is None:
        raise errors.not_found("run", run_id)
    if row["status"] == RunStatus.WAITING_APPROVAL and not row["expired"] and row["token_matches"]:
        check_run_access(principal, row["project_id"], APPROVER_ROLE, run_id)
        return row
    raise _refusal(principal, run_id, row["project_id"], row["status"], row["error_code"], expired=row["expired"])


def _left_by(cur: Row, approve: bool) -> bool:
    """The run is still where the decision left it (RESUMED, or FAILED as rejected); once it
    moved on (claimed, cancelled), a repeat is refused as any late decision is."""
    if approve:
        return bool(cur["cur_status"] == TRANSITIONS[Action.APPROVE].to_states[0])
    return bool(cur["cur_status"] == TRANSITIONS[Action.REJECT].to_states[0] and cur["cur_error_code"] == REJECTED_CODE)


# --- the expiry sweep ------------------------------------------------------------------------


async def expire_approvals(pool: asyncpg.Pool, saga: SagaNudger, batch: int = SWEEP_BATCH) -> int:
    """One sweep: fails every expired approval (in batches); returns how many. A batch that
    fails for one run's data is swept again one run at a time (that run skipped and noted)."""
    settled: list[int] = []

    async def statement(only: uuid.UUID | None, size: int) -> list[approvals_sql.ExpireApprovalsRow]:
        return await approvals_sql.expire_approvals(pool, batch=size, actor=SWEEP_ACTOR, only_run=only)

    async def due(size: int) -> list[uuid.UUID]:
        return [r["run_id"] for r in await approvals_sql.due_approvals(pool, batch=size)]

    await loops.in_batches(
        SWEEP_LOOP, SWEEP_ACTOR, pool, batch, statement, due, lambda rows: settled.append(_settle(rows, saga))
    )
    return sum(settled)


def _settle(rows: list[approvals_sql.ExpireApprovalsRow], saga: SagaNudger) -> int:
    metrics.APPROVALS_EXPIRED.inc(len(rows))
    for r in rows:
        if r["trigger"]:
            metrics.COMPENSATIONS.labels(r["trigger"]).inc()
            saga.nudge(str(r["run_id"]), r["trigger"], r["failure_reason"] or "")
    return len(rows)
