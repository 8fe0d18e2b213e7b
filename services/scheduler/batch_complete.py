"""CompleteRuns: many CompleteRun calls in ONE statement, and the claim that carries completions:
both are claims.sql ClaimRuns (CompleteRuns claims no runs of no project).

Per item the rules are CompleteRun's (fenced_writes.sql CompleteRun): the same SET list, fence
and audit row, and when an item changed nothing its error is chosen from the locked row by the
same helper (refusals.fenced_refusal). The batch is not atomic: each item succeeds or fails on
its own. A run named twice is completed at most once: the first item whose token names the
current attempt wins, and the others are answered as if they had arrived one after the other
(before the winner: the pre-state; after it: COMPLETED).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.common import errors
from services.common.access import check_run_access, projects_with
from services.common.auth import Principal
from services.common.db import Row, again_on_deadlock
from services.common.runstate import RunStatus
from services.scheduler import claim_answers, claims_sql, hand_back, metrics, replays
from services.scheduler.claim_answers import ClaimKey
from services.scheduler.claiming import Claim, claim_statement
from services.scheduler.refusals import fenced_refusal
from services.scheduler.saga_client import SagaNudger
from services.scheduler.transitions import COMPLETE, WORKER_ROLE, Changed, settled
from services.scheduler.workers import NO_ROUTING, Routing

# the claim statement for no runs of no project: only its completions
COMPLETE_MANY = claim_statement(0, 0)
# the claim parameters of CompleteRuns (it claims nothing and records no answer)
NO_CLAIM: dict[str, Any] = {
    "projects": [],
    "lease_secs": None,
    "worker_id": None,
    **NO_ROUTING.params(),
    **claim_answers.NO_KEY,
}


@dataclass(frozen=True)
class Item:
    run_id: str
    attempt: int
    output_json: str  # the output as compact JSON text (the validation's own, not encoded again)


async def complete_many(
    pool: asyncpg.Pool, principal: Principal, items: list[Item], *, saga: SagaNudger
) -> list[Changed | errors.ServiceError]:
    """Completes each item like CompleteRun; returns, in order, the change or the error
    CompleteRun would have raised for that item."""
    # the runs' triggers give their keys' slots back in the order the rows are updated, which a
    # batch cannot fix: should two such statements deadlock, the one aborted changed nothing
    params = _params(principal, items)
    rows = await again_on_deadlock(lambda: claims_sql.claim_runs(pool, count=0, max_runs=0, **params, **NO_CLAIM))
    # the rows after the items': the claim's (none claimed: one row of NULLs)
    return await _with_replays(pool, items, _outcomes(principal, items, rows[: len(items)], saga))


async def complete_and_claim(
    pool: asyncpg.Pool,
    principal: Principal,
    items: list[Item],
    *,
    projects: list[str],
    max_runs: int,
    lease_ttl: float,
    worker_id: str,
    saga: SagaNudger,
    key: ClaimKey | None = None,
    routing: Routing = NO_ROUTING,
) -> tuple[list[Changed | errors.ServiceError], Claim]:
    """complete_many, then a claim (claiming.claim_once), in one statement: the items' outcomes
    in order, and the claim (its rows oldest first; with a claim key whose answer is recorded,
    that answer: the items are still completed, or replayed, as always)."""
    claim_statement(len(projects), max_runs)
    keyed = key.params() if key is not None else claim_answers.NO_KEY
    params = _params(principal, items)
    for again in (True, False):
        try:
            # as complete_many (a deadlock aborts the statement whole: nothing completed, nothing claimed)
            rows = await again_on_deadlock(
                lambda: claims_sql.claim_runs(
                    pool,
                    count=len(projects),
                    max_runs=max_runs,
                    **params,
                    projects=projects,
                    lease_secs=lease_ttl,
                    worker_id=worker_id,
                    **routing.params(),
                    **keyed,
                )
            )
            break
        except asyncpg.exceptions.UniqueViolationError as err:
            # a concurrent call of the claim id recorded its answer first: this statement changed
            # nothing, and run again it replays that answer
            if not (again and key is not None and claim_answers.recorded_meanwhile(err)):
                raise
    n = len(items)
    if key is not None and rows[0]["recorded"]:
        claim = Claim(await claim_answers.replay(pool, key), replayed=True)
        metrics.CLAIM_REPLAYS.inc()
    else:
        claim = Claim([r for r in rows[n:] if r["run_id"] is not None])
        metrics.count_claims(claim.rows)
    try:
        outcomes = await _with_replays(pool, items, _outcomes(principal, items, rows[:n], saga))
    except Exception:
        # the claim is committed, but the call answers an error (a replay read failed): its runs
        # go back now instead of waiting RUNNING for their lease to expire
        await hand_back.undelivered(pool, claim.taken, worker_id, principal.actor, hand_back.ANSWER_FAILED)
        raise
    return outcomes, claim


def _params(principal: Principal, items: list[Item]) -> dict[str, Any]:
    """CompleteRuns' parameters by name."""
    return {
        "run_ids": [it.run_id for it in items],
        "attempts": [it.attempt for it in items],
        "outputs": [it.output_json for it in items],
        "allowed": list(COMPLETE.allowed),
        "worker_projects": projects_with(principal, WORKER_ROLE),
        "actor": principal.actor,
    }


def _outcomes(
    principal: Principal, items: list[Item], rows: Sequence[Row], saga: SagaNudger
) -> list[Changed | errors.ServiceError]:
    winners = {str(r["run_id"]): r["item"] for r in rows if r["run_id"] is not None}
    out: list[Changed | errors.ServiceError] = []
    for it, row in zip(items, rows, strict=True):
        if row["run_id"] is not None:
            out.append(settled(row, saga))
        else:
            out.append(_refusal(principal, it, row, winners.get(it.run_id)))
    return out


class _Replay(errors.ServiceError):
    """An item refused only because this lease already completed the run (replays.completed_by):
    answered with the run as it is, by _with_replays."""

    def __init__(self, err: errors.ServiceError, run_id: str) -> None:
        super().__init__(err.code, err.reason, err.message, metadata=err.metadata)
        self.run_id = run_id


async def _with_replays(
    pool: asyncpg.Pool, items: list[Item], outcomes: list[Changed | errors.ServiceError]
) -> list[Changed | errors.ServiceError]:
    replayed = [o.run_id for o in outcomes if isinstance(o, _Replay)]
    if not replayed:
        return outcomes
    rows = await replays.current_rows(pool, replayed)
    out: list[Changed | errors.ServiceError] = []
    for o in outcomes:
        row = rows.get(o.run_id) if isinstance(o, _Replay) else None
        out.append(Changed(row, None) if row is not None else o)
    return out


class _CompletedInBatch:
    """A refused item's locked row as its refusal sees it once an earlier item of the batch
    completed the run: cur_status COMPLETED."""

    def __init__(self, row: Row) -> None:
        self.row = row

    def __getitem__(self, key: str, /) -> Any:
        return RunStatus.COMPLETED.value if key == "cur_status" else self.row[key]


def _refusal(principal: Principal, it: Item, row: Row, winner: int | None) -> errors.ServiceError:
    if row["cur_run_id"] is None:
        return errors.not_found("run", it.run_id)
    try:
        check_run_access(principal, row["cur_project"], WORKER_ROLE, it.run_id)
    except errors.ServiceError as err:
        return err
    cur: Row = row
    if winner is not None and winner < row["item"]:  # an earlier item of this batch completed the run
        cur = _CompletedInBatch(row)
    refusal = fenced_refusal(cur, it.run_id, it.attempt, COMPLETE.describe(cur))
    if replays.completed_by(cur, it.attempt):  # this lease completed it (earlier, or earlier in this batch)
        return _Replay(refusal, it.run_id)
    if refusal.reason == errors.LEASE_LOST:
        metrics.LEASE_LOST.labels("CompleteRuns").inc()
    return refusal
