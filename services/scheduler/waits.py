"""Durable waits (issue 27; docs/architecture.md "Durable waits"): a run parks on a wait and holds
no lease, no worker slot and no connection until the wait ends.

A wait is a token any system completes (CompleteWait, or its callback URL on ingest's HTTP
server) or a sleep; both time out at `expires_at` (for a sleep that is its normal end). A run
parks on an open wait with AwaitWait (runstate PARK: RUNNING -> WAITING_TOOL without a lease, the
attempt's token spent); the wait's one outcome, completed or timed out, puts a parked run back to
PENDING in the same transaction, with the wake-up NOTIFY, and the handler runs again from the
top: its finished steps skip and the wait answers its outcome at once.

Ending a wait is one SQL function (awooop_end_wait, migration 0160) shared by CompleteWait, the
callback route and the timeout sweep, so the first outcome wins whichever path posts it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.common import errors, loops, wait_outcomes
from services.common.access import check_run_access, projects_with
from services.common.auth import Principal
from services.common.db import Row
from services.common.principals import TOOL_ROLE
from services.common.runstate import TRANSITIONS, Action, RunStatus, WaitKind, WaitStatus
from services.scheduler import waits_sql
from services.scheduler.approvals import APPROVER_ROLE, new_token
from services.scheduler.refusals import fenced_refusal
from services.scheduler.transitions import WORKER_ROLE

# who may complete a wait by RPC (issue 27): the workers of its project and a tool posting its
# result (the tool role, which may do nothing else), and an operator by hand (approver, below);
# admin implies them all. Not ingest: a key that feeds events in ends no wait by RPC (an event
# wait is ended by its event; a callback URL needs no key).
COMPLETE_ROLES = (WORKER_ROLE, TOOL_ROLE, APPROVER_ROLE)
# who may end a wait by hand (ExpireWait; CompleteWait too, above): an operator deciding how a
# parked run goes on, as an approval's decision does (an expiry may fail the run and compensate
# it), so the approver role; admin implies it. Worker keys are machines, not operators.
HAND_ROLES = (APPROVER_ROLE,)
READ_ROLES = ("ingest", WORKER_ROLE, APPROVER_ROLE)
CALLBACK_PATH = "/v1/waits/"
SWEEP_LOOP = "scheduler.wait_sweep"
SWEEP_ACTOR = "system:wait-sweep"
EVENTS_ACTOR = "system:wait-events"
SWEEP_BATCH = 500


@dataclass(frozen=True)
class EventMatch:
    """What an event wait waits for: an event of `channel` whose payload's "correlation_key" is
    `correlation_key`, arrived at most `lookback` seconds before the wait was created, or later."""

    channel: str
    correlation_key: str
    lookback: float


@dataclass(frozen=True)
class Created:
    wait: Row
    token: str  # "" when this call issued none (a sleep, or a wait that has ended)
    created: bool


async def create(
    pool: asyncpg.Pool,
    principal: Principal,
    run_id: str,
    attempt: int,
    step_id: str,
    kind: str,
    timeout: float,
    match: EventMatch | None = None,
) -> Created:
    """The wait step_id of the caller's RUNNING run (created, or found again); an open token wait
    gets a new token. NOT_FOUND / LEASE_LOST / INVALID_TRANSITION when the lease does not hold."""
    token, digest = new_token()
    row = await waits_sql.create_wait(
        pool,
        run_id=run_id,
        attempt=attempt,
        projects=projects_with(principal, WORKER_ROLE),
        step_id=step_id,
        kind=kind,
        token_hash=digest,
        timeout=timeout,
        match_channel=match.channel if match else None,
        match_key=match.correlation_key if match else None,
        lookback=match.lookback if match else 0.0,
    )
    if row is None:
        await _refuse_lease(pool, principal, run_id, attempt, TRANSITIONS[Action.PARK].describe)
    assert row is not None
    return Created(row, token if row["issued"] else "", bool(row["created"]))


async def _refuse_lease(pool: asyncpg.Pool, principal: Principal, run_id: str, attempt: int, action: str) -> None:
    """Raises the error of a fenced call that found no lease (the same choice as any fenced write)."""
    cur = await waits_sql.run_state(pool, run_id=run_id)
    if cur is None:
        raise errors.not_found("run", run_id)
    check_run_access(principal, cur["cur_project"], WORKER_ROLE, run_id)
    raise fenced_refusal(cur, run_id, attempt, action)


async def park(pool: asyncpg.Pool, principal: Principal, run_id: str, attempt: int, wait_id: str) -> tuple[bool, Row]:
    """(True, wait): the run is parked on its open wait. (False, wait): the wait had ended (its
    outcome is in the row) and the run goes on under its lease."""
    row = await waits_sql.park_on_wait(
        pool,
        run_id=run_id,
        attempt=attempt,
        wait_id=wait_id,
        projects=projects_with(principal, WORKER_ROLE),
        actor=principal.actor,
    )
    if row is None:
        raise errors.not_found("run", run_id)
    check_run_access(principal, row["cur_project"], WORKER_ROLE, run_id)
    if row["wait_id"] is None:
        raise errors.not_found("wait", wait_id, run_id=run_id)
    if row["parked"]:
        return True, row
    if (
        row["wait_status"] != WaitStatus.OPEN
        and row["cur_attempt"] == attempt
        and row["cur_status"] == RunStatus.RUNNING
    ):
        return False, row  # ended before the run waited: the handler takes the outcome at once
    if row["cur_cancel"] and row["cur_attempt"] == attempt and row["cur_status"] == RunStatus.RUNNING:
        raise errors.invalid_transition(run_id, row["cur_status"], "park on a wait while a cancel is pending for")
    raise fenced_refusal(row, run_id, attempt, TRANSITIONS[Action.PARK].describe)


async def complete(pool: asyncpg.Pool, principal: Principal, wait_id: str, result: dict[str, Any]) -> Row:
    """CompleteWait: the wait's one outcome (awooop_end_wait). NOT_FOUND for an unknown wait or
    one of a project the caller has no role in; PERMISSION_DENIED to a member of its project
    without a role of COMPLETE_ROLES; WAIT_CLOSED naming the first outcome; INVALID_TRANSITION
    when the run is over."""
    row = await waits_sql.complete_wait(
        pool, wait_id=wait_id, result=result, actor=principal.actor, projects=projects_with(principal, COMPLETE_ROLES)
    )
    if row is None:  # a children wait: its children end it (migration 0190)
        raise errors.wait_closed(
            wait_id, f"wait {wait_id} waits for child runs: it ends only when they end", kind=WaitKind.CHILDREN
        )
    if row["outcome"] == "not_found":
        await _refuse_outside(pool, principal, wait_id, COMPLETE_ROLES, "complete")
    return wait_outcomes.ended(row, wait_id)


async def expire_by_hand(pool: asyncpg.Pool, principal: Principal, wait_id: str) -> Row:
    """ExpireWait: the wait ends timed out now (awooop_end_wait: the first outcome wins), audited
    with the operator as actor. NOT_FOUND for an unknown wait or one outside the caller's
    approver projects (PERMISSION_DENIED when the caller has another role there); WAIT_CLOSED
    naming the first outcome; INVALID_TRANSITION naming the run's status when the run is over
    (migration 0240: the sweep closes such waits, an operator's expiry changes nothing)."""
    row = await waits_sql.expire_wait(
        pool, wait_id=wait_id, actor=principal.actor, projects=projects_with(principal, HAND_ROLES)
    )
    assert row is not None  # the function always answers one row
    if row["outcome"] == "not_found":
        await _refuse_outside(pool, principal, wait_id, HAND_ROLES, "expire")
    return wait_outcomes.ended(row, wait_id, Action.EXPIRE_WAIT)


async def _refuse_outside(
    pool: asyncpg.Pool, principal: Principal, wait_id: str, roles: tuple[str, ...], verb: str
) -> None:
    """A wait the statement did not find in the caller's projects for roles: PERMISSION_DENIED
    naming the roles when the caller holds another role in the wait's project; otherwise it
    returns, and the caller answers NOT_FOUND for the wait (as for an unknown one: another
    project's wait and run ids cannot be probed)."""
    seen = await waits_sql.wait_project(pool, wait_id=wait_id)
    if seen is None:
        return
    project = seen["project_id"]
    held = principal.roles_in(project)
    if held and not held & set(roles):
        names = " or ".join(roles)
        raise errors.forbidden(
            f"principal {principal.principal_id} has no {names} role in project {project} to {verb} wait {wait_id}",
            project_id=project,
            role=names,
            wait_id=wait_id,
        )


async def list_for_run(pool: asyncpg.Pool, principal: Principal, run_id: str) -> list[Row]:
    """ListWaits: the run's waits, open ones first. NOT_FOUND for an unknown run or one outside
    the caller's projects."""
    rows = await waits_sql.list_waits(pool, run_id=run_id)
    if not rows:
        raise errors.not_found("run", run_id)
    check_run_access(principal, rows[0]["run_project"], READ_ROLES, run_id)
    return [r for r in rows if r["wait_id"] is not None]


def callback_url(base: str, token: str) -> str:
    return f"{base.rstrip('/')}{CALLBACK_PATH}{token}"


# --- the timeout sweep -----------------------------------------------------------------------


async def sweep(pool: asyncpg.Pool, batch: int = SWEEP_BATCH) -> int:
    """One pass of the scheduler's wait loop: event waits matched first (an event that arrived
    in time wins over the timeout of the same pass), then timeouts. Returns the waits ended."""
    return await match_events(pool, batch) + await expire(pool, batch)


async def match_events(pool: asyncpg.Pool, batch: int = SWEEP_BATCH) -> int:
    """Open event waits that an event satisfies end completed with it (MatchEventWaits)."""
    done: list[int] = []

    async def statement(only: uuid.UUID | None, size: int) -> list[waits_sql.MatchEventWaitsRow]:
        return await waits_sql.match_event_waits(pool, only=only, batch=size, actor=EVENTS_ACTOR)

    async def due(size: int) -> list[uuid.UUID]:
        return [r["run_id"] for r in await waits_sql.matched_event_wait_runs(pool, batch=size)]

    await loops.in_batches(SWEEP_LOOP, EVENTS_ACTOR, pool, batch, statement, due, lambda rows: _settle(rows, done))
    return sum(done)


async def expire(pool: asyncpg.Pool, batch: int = SWEEP_BATCH) -> int:
    """One sweep: every open wait past its expiry ends timed_out (runs parked on them resume);
    returns how many. A batch that fails for one run's data is swept again one run at a time
    (that run skipped and noted)."""
    done: list[int] = []

    async def statement(only: uuid.UUID | None, size: int) -> list[waits_sql.ExpireWaitsRow]:
        return await waits_sql.expire_waits(pool, only=only, batch=size, actor=SWEEP_ACTOR)

    async def due(size: int) -> list[uuid.UUID]:
        return [r["run_id"] for r in await waits_sql.due_wait_runs(pool, batch=size)]

    await loops.in_batches(SWEEP_LOOP, SWEEP_ACTOR, pool, batch, statement, due, lambda rows: _settle(rows, done))
    return sum(done)


def _settle(rows: list[waits_sql.MatchEventWaitsRow] | list[waits_sql.ExpireWaitsRow], done: list[int]) -> None:
    for row in rows:
        wait_outcomes.count(row)
    done.append(len(rows))
