"""Retried worker writes: a CompleteRun / CompleteRuns item / ClaimRuns.complete item, FailRun
or ReleaseRun whose first attempt committed (and whose answer was lost: a scheduler crash, a dropped
connection, a client timeout) answers the same success when the same lease sends it again.

The fencing token says who may have written: only the holder of attempt N can complete or
fail the run during attempt N, and attempt_count changes with every new claim. So:

- COMPLETED with attempt_count = N: the holder of N completed it (a run is never reaped or
  cancelled into COMPLETED);
- PENDING / FAILED / CANCELLED with attempt_count = N and a FailRun audit row of attempt N
  (only FailRun writes `retryable` into its details): the holder of N failed it.
- PENDING / CANCELLED with attempt_count = N and a ReleaseRun audit row of attempt N (only
  ReleaseRun writes `released`; a claim's hand-back of undelivered runs does not): the holder
  of N released it. A later claim makes the attempt N + 1, and the repeat is LEASE_LOST.
- WaitTool, ResumeTool, AcknowledgeCancel: the run is where the write leaves it (WAITING_TOOL,
  RUNNING, CANCELLED) with attempt_count = N, and the audit log holds that write's action
  (WAITING_TOOL, TOOL_RETURNED, CANCELLED) of attempt N from a leased status: only the holder of N
  writes those (a CANCELLED of attempt N from a leased status is this lease ending the run
  cancelled, which is what acknowledging asks).
- CancelRun (an operator's, not a lease's): CANCELLED, and the audit log holds this actor's
  cancel or cancel request of the run.

These checks run only on the refusal path (the write changed nothing), so the ordinary path
costs nothing more. The answer is the run as it is now; nothing is written again, counted again
or nudged again."""

from __future__ import annotations

import asyncpg

from services.common.db import Row
from services.common.runstate import TRANSITIONS, Action, RunStatus
from services.scheduler import replays_sql
from services.scheduler.refusals import lease_was_reaped

_COMPLETED_INTO = TRANSITIONS[Action.COMPLETE].replays_from
_FAILED_INTO = TRANSITIONS[Action.FAIL].replays_from
_RELEASED_INTO = TRANSITIONS[Action.RELEASE].replays_from
_CANCEL_AUDITS = [o.audit.value for o in TRANSITIONS[Action.CANCEL].outcomes]


def completed_by(cur: Row, attempt: int) -> bool:
    """The locked row (cur_* columns) shows this lease's completion."""
    return bool(cur["cur_status"] in _COMPLETED_INTO and cur["cur_attempt"] == attempt)


async def failed_by(pool: asyncpg.Pool, cur: Row, run_id: str, attempt: int) -> bool:
    if cur["cur_attempt"] != attempt or cur["cur_status"] not in _FAILED_INTO:
        return False
    if cur["cur_status"] != RunStatus.PENDING and lease_was_reaped(cur):  # a reaped lease's FailRun never committed
        return False
    return bool(await replays_sql.failed_by(pool, run_id=run_id, attempt=attempt))


async def released_by(pool: asyncpg.Pool, cur: Row, run_id: str, attempt: int) -> bool:
    if cur["cur_attempt"] != attempt or cur["cur_status"] not in _RELEASED_INTO:
        return False
    return bool(await replays_sql.released_by(pool, run_id=run_id, attempt=attempt))


async def wrote(pool: asyncpg.Pool, cur: Row, run_id: str, attempt: int, action: Action) -> bool:
    """The holder of `attempt` made the transition `action`, and the run is still where it left it."""
    t = TRANSITIONS[action]
    if cur["cur_attempt"] != attempt or cur["cur_status"] not in t.replays_from:
        return False
    audits = [t.audit_for(status) for status in t.replays_from]
    return bool(await replays_sql.wrote(pool, run_id=run_id, attempt=attempt, audit_actions=audits))


async def cancelled_by(pool: asyncpg.Pool, cur: Row, run_id: str, actor: str) -> bool:
    if cur["cur_status"] not in TRANSITIONS[Action.CANCEL].replays_from:
        return False
    return bool(await replays_sql.cancelled_by(pool, run_id=run_id, actor=actor, audit_actions=_CANCEL_AUDITS))


async def current_rows(pool: asyncpg.Pool, run_ids: list[str]) -> dict[str, replays_sql.CurrentRunsRow]:
    """run id -> the run as it is now (every run column and comp_trigger)."""
    rows = await replays_sql.current_runs(pool, run_ids=run_ids)
    return {str(r["run_id"]): r for r in rows}
