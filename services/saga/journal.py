"""The step journal (seed ADR-119 D1, D2): begin, complete, fail, read.

Every write is ONE statement fenced by the lease: it only writes while the run is RUNNING or
WAITING_TOOL with attempt_count equal to the caller's token, and it locks that run row (FOR
SHARE, or FOR NO KEY UPDATE when it allocates a seq) so a reap or a fail committed first makes the
write find nothing. Each write touches one step row and looks up max(seq) through the unique
(run_id, seq) index, so its cost does not grow with the journal. When nothing was written, one
follow-up read finds out why (not found, LEASE_LOST, invalid step transition, bad argument).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc

from services.common import errors
from services.common.access import check_run_access, projects_with
from services.common.auth import Principal
from services.common.principals import ROLES
from services.common.runstate import LEASED
from services.saga.steps import IRREVERSIBLE_TOOLS, STEP_COLUMNS

# How often a write is tried again when the follow-up read finds nothing wrong: the state changed
# between the write and the read (a concurrent write of the same step); the next try decides.
WRITE_TRIES = 3
SEQ_CONSTRAINT = "awooop_saga_step_run_id_seq_key"
SEQ_RACE_TRIES = 100  # each lost race means another begin of the run committed: progress

_S = ", ".join(f"s.{c.strip()}" for c in STEP_COLUMNS.split(","))


def _lease(projects: str, leased: str, lock: str, columns: str) -> str:
    """CTE `lease`: the run row, locked, only while it is leased (RUNNING / WAITING_TOOL, the
    `leased` parameter) with the caller's fencing token ($2) in a project the caller may write
    (the `projects` parameter; NULL: every project)."""
    return f"""lease AS (
    SELECT {columns} FROM awooop_run_state
     WHERE run_id = $1 AND attempt_count = $2 AND status = ANY({leased}::text[])
       AND ({projects}::text[] IS NULL OR project_id = ANY({projects}::text[]))
       FOR {lock}
)"""


# $1 run_id, $2 attempt, $3 step_id, $4 step_type, $5 tool_id, $6 tool_params, $7 projects, $8 leased statuses
BEGIN_SQL = f"""
WITH {_lease("$7", "$8", "NO KEY UPDATE", "run_id, project_id")}
INSERT INTO awooop_saga_step AS s (run_id, step_id, project_id, seq, step_type, tool_id, tool_params, status, attempt)
SELECT l.run_id, $3, l.project_id,
       COALESCE((SELECT max(seq) FROM awooop_saga_step WHERE run_id = l.run_id), 0) + 1,
       $4, $5, $6, 'pending', $2
  FROM lease l
ON CONFLICT (run_id, step_id) DO UPDATE
   SET status = 'pending', attempt = EXCLUDED.attempt, tool_params = EXCLUDED.tool_params,
       error = NULL, completed_at = NULL
 WHERE s.status IN ('pending', 'failed')
   AND s.step_type = EXCLUDED.step_type
   AND s.tool_id IS NOT DISTINCT FROM EXCLUDED.tool_id
RETURNING (s.xmax = 0) AS inserted, {_S}
"""

# RecordStep: a step that already ran, journaled completed (or failed) in one statement, the way
# BeginStep journals it pending (same lease lock, same seq allocation). A pending or failed row of
# the same kind (an earlier attempt's) is overwritten; a completed one is left alone.
# It commits without waiting for the WAL flush (synchronous_commit off for this transaction only):
# a record lost in a Postgres crash means the step runs again, which is all a crash mid-step means
# for these steps anyway. The next synchronous commit of the run (a tool call's BeginStep, the run's
# completion) flushes it, so no later journal entry or run state can outlive it.
# $1 run_id, $2 attempt, $3 step_id, $4 step_type, $5 status, $6 result, $7 error, $8 projects, $9 leased,
# $10 params
RECORD_SQL = f"""
WITH {_lease("$8", "$9", "NO KEY UPDATE", "run_id, project_id")},
async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
INSERT INTO awooop_saga_step AS s (run_id, step_id, project_id, seq, step_type, tool_params, status, result, error,
                                   attempt, completed_at)
SELECT l.run_id, $3, l.project_id,
       COALESCE((SELECT max(seq) FROM awooop_saga_step WHERE run_id = l.run_id), 0) + 1,
       $4, $10, $5, $6, $7, $2, now()
  FROM lease l, async_commit
ON CONFLICT (run_id, step_id) DO UPDATE
   SET status = EXCLUDED.status, result = EXCLUDED.result, error = EXCLUDED.error, attempt = EXCLUDED.attempt,
       tool_params = EXCLUDED.tool_params, completed_at = now()
 WHERE s.status IN ('pending', 'failed')
   AND s.step_type = EXCLUDED.step_type AND s.tool_id IS NULL
RETURNING {_S}
"""

# $1 run_id, $2 attempt, $3 step_id, $4 result, $5 compensation_cmd, $6 projects, $7 leased, $8 irreversible tools
COMPLETE_SQL = f"""
WITH {_lease("$6", "$7", "SHARE", "run_id")}
UPDATE awooop_saga_step s
   SET status = 'completed', result = $4, compensation_cmd = $5, error = NULL, completed_at = now()
 WHERE s.run_id = (SELECT run_id FROM lease) AND s.step_id = $3
   AND s.status = 'pending' AND s.attempt = $2
   AND ($5::jsonb IS NULL OR (s.step_type = 'tool_call' AND COALESCE(s.tool_id, '') <> ALL($8::text[])))
RETURNING {_S}
"""

# $1 run_id, $2 attempt, $3 step_id, $4 error, $5 projects, $6 leased
FAIL_SQL = f"""
WITH {_lease("$5", "$6", "SHARE", "run_id")}
UPDATE awooop_saga_step s
   SET status = 'failed', error = $4, completed_at = now()
 WHERE s.run_id = (SELECT run_id FROM lease) AND s.step_id = $3
   AND s.status = 'pending' AND s.attempt = $2
RETURNING {_S}
"""

# The follow-up read: the run, the caller's lease and the step, in one snapshot.
WHY_SQL = f"""
SELECT r.project_id, r.status AS run_status, r.attempt_count, s.step_id IS NOT NULL AS has_step, {_S}
  FROM awooop_run_state r
  LEFT JOIN awooop_saga_step s ON s.run_id = r.run_id AND s.step_id = $2
 WHERE r.run_id = $1
"""

RUN_SQL = """
SELECT project_id, saga_status, compensation_started_at, compensation_completed_at
  FROM awooop_run_state WHERE run_id = $1
"""
STEPS_SQL = f"SELECT {STEP_COLUMNS} FROM awooop_saga_step WHERE run_id = $1 ORDER BY seq"
SEED_JSON_SQL = "SELECT saga_steps FROM awooop_run_saga_steps WHERE run_id = $1"


@dataclass(frozen=True)
class Lease:
    run_id: str
    attempt: int


@dataclass(frozen=True)
class Begun:
    action: str  # execute | skip | retry
    step: asyncpg.Record


@dataclass(frozen=True)
class Recorded:
    recorded: bool  # False: the step was already completed and its first result stands
    step: asyncpg.Record


@dataclass(frozen=True)
class Journal:
    run: asyncpg.Record
    steps: list[asyncpg.Record]
    seed_steps: list[dict[str, Any]]


def step_transition(run_id: str, step_id: str, status: str, action: str, hint: str = "") -> errors.ServiceError:
    return errors.ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.INVALID_TRANSITION,
        f"cannot {action} step {step_id} of run {run_id} in status {status}{hint}",
        metadata={"run_id": run_id, "step_id": step_id, "status": status, "action": action},
    )


def _retry_later() -> errors.ServiceError:
    return errors.store_unavailable("the step changed concurrently, retry")


async def _why(
    conn: asyncpg.Connection | asyncpg.Pool, principal: Principal, lease: Lease, step_id: str
) -> asyncpg.Record:
    """The follow-up read after a write changed nothing: raises NOT_FOUND / FORBIDDEN / LEASE_LOST,
    or returns the row for the operation to decide."""
    row = await conn.fetchrow(WHY_SQL, lease.run_id, step_id)
    check_run_access(principal, row["project_id"] if row else None, "worker", lease.run_id)
    assert row is not None
    if row["attempt_count"] != lease.attempt or row["run_status"] not in LEASED:
        raise errors.lease_lost(lease.run_id, lease.attempt)
    return row


def _same_kind(row: Any, step_type: str, tool_id: str | None) -> bool:
    return bool(row["step_type"] == step_type and row["tool_id"] == tool_id)


async def _new_step(
    pool: asyncpg.Pool,
    principal: Principal,
    lease: Lease,
    step_id: str,
    step_type: str,
    tool_id: str | None,
    action: str,
    sql: str,
    *args: Any,
) -> tuple[bool, asyncpg.Record]:
    """Runs a step-inserting statement (BEGIN_SQL, RECORD_SQL): (True, the written row), or
    (False, the step as journaled) when it was already completed. Raises NOT_FOUND / LEASE_LOST,
    INVALID_ARGUMENT for a step id journaled as another kind of step, INVALID_TRANSITION for a
    step past completion.

    A seq race is run again: two new steps of one run began at once, the run-row lock made
    this statement wait, but its max(seq) was read in the snapshot taken before the wait; the
    next try sees the winner's row. (A worker journals its steps one at a time; this only
    happens under races.)"""
    tries = races = 0
    while tries < WRITE_TRIES and races < SEQ_RACE_TRIES:
        try:
            row = await pool.fetchrow(sql, *args)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != SEQ_CONSTRAINT:
                raise
            races += 1
            continue
        tries += 1
        if row is not None:
            return True, row
        why = await _why(pool, principal, lease, step_id)
        if not why["has_step"]:
            continue  # lease held and no step: the insert raced with something; try again
        if not _same_kind(why, step_type, tool_id):
            raise _other_kind(step_id, why)
        if why["status"] == "completed":
            return False, why
        if why["status"] not in ("pending", "failed"):
            raise step_transition(lease.run_id, step_id, why["status"], action)
    raise _retry_later()


def _other_kind(step_id: str, why: Any) -> errors.ServiceError:
    return errors.invalid(
        [
            (
                "step_id",
                f"step {step_id} is already journaled as {why['step_type']}"
                f"{' ' + why['tool_id'] if why['tool_id'] else ''}; a step id names one step",
            )
        ]
    )


async def begin_step(
    pool: asyncpg.Pool,
    principal: Principal,
    lease: Lease,
    step_id: str,
    step_type: str,
    tool_id: str | None,
    tool_params: dict[str, Any] | None,
) -> Begun:
    scope = projects_with(principal, "worker")
    wrote, row = await _new_step(
        pool,
        principal,
        lease,
        step_id,
        step_type,
        tool_id,
        "begin",
        BEGIN_SQL,
        lease.run_id,
        lease.attempt,
        step_id,
        step_type,
        tool_id,
        tool_params,
        scope,
        list(LEASED),
    )
    return Begun(("execute" if row["inserted"] else "retry") if wrote else "skip", row)


async def record_step(
    pool: asyncpg.Pool,
    principal: Principal,
    lease: Lease,
    step_id: str,
    step_type: str,
    result: dict[str, Any] | None,
    error: str | None,
    params: dict[str, Any] | None = None,
) -> Recorded:
    """Journals a step that already ran: completed with result, or failed with error."""
    scope = projects_with(principal, "worker")
    status = "failed" if error is not None else "completed"
    wrote, row = await _new_step(
        pool,
        principal,
        lease,
        step_id,
        step_type,
        None,
        "record",
        RECORD_SQL,
        lease.run_id,
        lease.attempt,
        step_id,
        step_type,
        status,
        result,
        error,
        scope,
        list(LEASED),
        params,
    )
    return Recorded(wrote, row)


async def complete_step(
    pool: asyncpg.Pool,
    principal: Principal,
    lease: Lease,
    step_id: str,
    result: dict[str, Any],
    compensation_cmd: dict[str, Any] | None,
) -> asyncpg.Record:
    scope = projects_with(principal, "worker")
    for _ in range(WRITE_TRIES):
        row = await pool.fetchrow(
            COMPLETE_SQL,
            lease.run_id,
            lease.attempt,
            step_id,
            result,
            compensation_cmd,
            scope,
            list(LEASED),
            list(IRREVERSIBLE_TOOLS),
        )
        if row is not None:
            return row
        why = await _why(pool, principal, lease, step_id)
        if not why["has_step"]:
            raise errors.not_found("step", step_id, run_id=lease.run_id)
        status = why["status"]
        if status == "completed" and why["attempt"] == lease.attempt:
            return why  # a repeated CompleteStep: the first recorded result stands
        if compensation_cmd is not None and why["step_type"] != "tool_call":
            raise errors.invalid(
                [
                    (
                        "compensation_cmd",
                        f"only tool_call steps carry a compensation command; {step_id} is a "
                        f"{why['step_type']} step (seed ADR-119 D3)",
                    )
                ]
            )
        if compensation_cmd is not None and why["tool_id"] in IRREVERSIBLE_TOOLS:
            raise errors.invalid(
                [("compensation_cmd", f"{why['tool_id']} is irreversible and is never compensated (seed ADR-119 D6)")]
            )
        if status == "pending" and why["attempt"] != lease.attempt:
            raise step_transition(
                lease.run_id, step_id, status, "complete", f" (begun by attempt {why['attempt']}: BeginStep it first)"
            )
        if status != "pending":
            raise step_transition(lease.run_id, step_id, status, "complete")
    raise _retry_later()


async def fail_step(pool: asyncpg.Pool, principal: Principal, lease: Lease, step_id: str, error: str) -> asyncpg.Record:
    scope = projects_with(principal, "worker")
    for _ in range(WRITE_TRIES):
        row = await pool.fetchrow(FAIL_SQL, lease.run_id, lease.attempt, step_id, error, scope, list(LEASED))
        if row is not None:
            return row
        why = await _why(pool, principal, lease, step_id)
        if not why["has_step"]:
            raise errors.not_found("step", step_id, run_id=lease.run_id)
        status = why["status"]
        if status == "failed" and why["attempt"] == lease.attempt:
            return why  # a repeated FailStep
        if status == "pending" and why["attempt"] != lease.attempt:
            raise step_transition(
                lease.run_id, step_id, status, "fail", f" (begun by attempt {why['attempt']}: BeginStep it first)"
            )
        if status != "pending":
            raise step_transition(lease.run_id, step_id, status, "fail")
    raise _retry_later()


async def get_journal(pool: asyncpg.Pool, principal: Principal, run_id: str) -> Journal:
    """The journal in order, read in one snapshot. Any role in the run's project may read it, as
    GetRun and GetRunHistory (`awooop runs show` reads all three)."""
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        run = await conn.fetchrow(RUN_SQL, run_id)
        check_run_access(principal, run["project_id"] if run else None, ROLES, run_id)
        assert run is not None  # check_run_access raised NOT_FOUND for a missing run
        steps = await conn.fetch(STEPS_SQL, run_id)
        seed = await conn.fetchval(SEED_JSON_SQL, run_id)
    return Journal(run, list(steps), seed or [])
