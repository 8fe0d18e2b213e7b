"""CompleteRuns: many CompleteRun calls in ONE statement.

Per item the rules are CompleteRun's (transitions.COMPLETE): the same SET list, the same
fence (token, status, role; fragments.fence_where) and the same audit row, and when an item
changed nothing its error is chosen from the locked row by the same helper
(fragments.fenced_refusal). The batch is not atomic: each item succeeds or fails on its own.

Rows are locked in run_id order, so overlapping batches running at the same time wait for
each other instead of deadlocking. A run named twice is completed at most once: the first
item whose token names the current attempt wins, and the others are answered as if they had
arrived one after the other (before the winner: the pre-state; after it: COMPLETED).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.common import errors
from services.common.access import check_run_access, projects_with
from services.common.audit import AUDIT_INSERT
from services.common.auth import Principal
from services.common.db import Row, fetch_again_on_deadlock
from services.common.runs import RUN_COLUMNS
from services.common.runstate import Audit, RunStatus
from services.common.server_plans import keep_plan
from services.scheduler import budget, claim_answers, metrics, replays
from services.scheduler.claim_answers import ClaimKey
from services.scheduler.claiming import Claim, claim_ctes, hand_back_undelivered, projects_arg
from services.scheduler.fragments import (
    CUR_COLUMNS,
    FENCED_AUDIT_DETAILS,
    RUN_COLUMNS_R,
    complete_set,
    fence_where,
    fenced_refusal,
)
from services.scheduler.saga_client import SagaNudger
from services.scheduler.transitions import COMPLETE, WORKER_ROLE, Changed, settled


def complete_ctes(*, claiming: bool) -> str:
    """$1 run ids, $2 attempts, $3 outputs (JSON text), all in request order; $4 allowed statuses,
    $5 projects where the caller is a worker (NULL: all), $6 actor. The locked rows (`cur`), the
    concurrency keys the statement locks (`held_keys`), the winning item per run (`win`), the
    completed rows (`upd`) and their audit rows (`aud`).

    held_keys: the locked runs' keys (with claiming, the picked runs' too), locked in key order in
    one pass before `upd` starts; the triggers that give the completed runs' slots back, and the
    claim's awooop_grant_keys, then find them held. Taken run by run, in the order the rows
    happen to be updated, they could close a cycle (a deadlock) with a claim or a batch sharing
    the keys."""
    picked = ""
    if claiming:
        picked = "\n             UNION ALL SELECT p.project_id, k FROM picked p CROSS JOIN LATERAL unnest(p.ckeys) AS k"
    return f"""items AS (
    SELECT t.item, t.run_id, t.attempt, t.output::jsonb AS output
      FROM unnest($1::uuid[], $2::int[], $3::text[]) WITH ORDINALITY AS t(run_id, attempt, output, item)
),
cur AS (
    SELECT {CUR_COLUMNS}, concurrency_keys AS cur_keys
      FROM awooop_run_state
     WHERE run_id IN (SELECT run_id FROM items)
     ORDER BY run_id
       FOR UPDATE
),
held_keys AS MATERIALIZED (
    SELECT l.project_id, l.key FROM awooop_concurrency_limit l
     WHERE (l.project_id, l.key) IN (
             SELECT c.cur_project, k FROM cur c CROSS JOIN LATERAL unnest(c.cur_keys) AS k{picked})
     ORDER BY l.project_id, l.key
       FOR UPDATE
),
win AS (
    SELECT DISTINCT ON (it.run_id) it.item, it.run_id, it.attempt, it.output, cur.cur_status, cur.cur_worker
      FROM items it JOIN cur ON cur.cur_run_id = it.run_id
     WHERE it.attempt = cur.cur_attempt
     ORDER BY it.run_id, it.item
),
upd AS (
    UPDATE awooop_run_state r
       SET {complete_set("w.output")}, updated_at = now()
      FROM win w
     WHERE r.run_id = w.run_id
       AND {fence_where("w.attempt", "$4::text[]", "$5::text[]")}
       AND (SELECT count(*) FROM held_keys) >= 0
 RETURNING {RUN_COLUMNS_R}, w.cur_status AS from_status, w.item AS upd_item, w.cur_worker AS prev_worker
),
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, $6, '{Audit.COMPLETED}', from_status, status, NULL, {FENCED_AUDIT_DETAILS}
      FROM upd
)"""


def complete_items_select(extra: str = "") -> str:
    """One row per item, in order: the locked row's state (cur_*; NULL when the run does not
    exist) and, when this item completed the run, the changed row (run_id not NULL); extra: more
    columns."""
    return f"""SELECT it.item, cur.*, upd.*, NULL::text AS comp_trigger, NULL::float8 AS claim_wait{extra}
  FROM items it
  LEFT JOIN cur ON cur.cur_run_id = it.run_id
  LEFT JOIN upd ON upd.upd_item = it.item"""


COMPLETE_ITEMS_SELECT = complete_items_select()

COMPLETE_MANY_SQL = keep_plan(f"""
WITH {complete_ctes(claiming=False)}
{COMPLETE_ITEMS_SELECT}
 ORDER BY it.item
""")


# claimed's columns but claim_wait, which goes last (under the first branch's claim_wait)
CLAIMED_COLUMNS = ", ".join(f"claimed.{c.strip()}" for c in RUN_COLUMNS.split(","))


@functools.lru_cache(maxsize=512)
def complete_and_claim_sql(count: int, max_runs: int, *, answered: bool = False) -> str:
    """ClaimRuns carrying completions: COMPLETE_MANY_SQL's parameters, then $7 project(s), $8
    lease seconds, $9 worker id (actor: $6); max_runs and count as claiming.claim_ctes. answered
    (a claim with a claim id): $10 principal, $11 claim id, $12 sorted projects, and every row
    carries `recorded` (an answer was recorded for the claim id before: nothing was claimed).

    One statement, one commit: the items are completed first (the claim's scan starts after
    `cur` locked them: a one-time filter), then up to max_runs runs are claimed. The two never
    touch the same row: `upd` changes rows that are RUNNING in the statement's snapshot, the
    claim rows that are PENDING/RESUMED in it. Rows with item NULL are the claimed runs
    (oldest first), after the items' rows in item order. RECURSIVE (nothing recurses) lets
    held_keys name `picked`, which comes later in the list: the statement locks the keys of the
    runs it completes and of those it picks in one ordered pass."""
    answer = ("$10", "$11") if answered else None
    recorded = f", {claim_answers.RECORDED}" if answered else ""
    ctes = claim_ctes(
        "$7", max_runs, "$8", "$9", "$6", count=count, after="(SELECT count(*) FROM cur) >= 0", answered=answer
    )
    return keep_plan(f"""
WITH RECURSIVE {complete_ctes(claiming=True)},
{ctes}
{complete_items_select(recorded)}
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, {CLAIMED_COLUMNS}, claimed.from_status,
       NULL, NULL, NULL, claimed.claim_wait{recorded}
  FROM claimed
 ORDER BY item, created_at
""")


@dataclass(frozen=True)
class Item:
    run_id: str
    attempt: int
    output: dict[str, Any]


async def complete_many(
    pool: asyncpg.Pool, principal: Principal, items: list[Item], *, saga: SagaNudger
) -> list[Changed | errors.ServiceError]:
    """Completes each item like CompleteRun; returns, in order, the change or the error
    CompleteRun would have raised for that item."""
    # the runs' triggers give their keys' slots back in the order the rows are updated, which a
    # batch cannot fix: should two such statements deadlock, the one aborted changed nothing
    rows = await fetch_again_on_deadlock(pool, COMPLETE_MANY_SQL, *_params(principal, items))
    return await _with_replays(pool, items, _outcomes(principal, items, rows, saga))


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
) -> tuple[list[Changed | errors.ServiceError], Claim]:
    """complete_many, then a claim (claiming.claim_once), in one statement: the items' outcomes
    in order, and the claim (its rows oldest first; with a claim key whose answer is recorded,
    that answer: the items are still completed, or replayed, as always)."""
    count, arg = projects_arg(projects)
    sql = complete_and_claim_sql(count, max_runs, answered=key is not None)
    params = (*_params(principal, items), arg, lease_ttl, worker_id, *(key.params() if key is not None else ()))
    for again in (True, False):
        try:
            # as complete_many (a deadlock aborts the statement whole: nothing completed, nothing claimed)
            rows = await fetch_again_on_deadlock(pool, sql, *params)
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
        claim = Claim(rows[n:])
        metrics.count_claims(claim.rows)
    try:
        outcomes = await _with_replays(pool, items, _outcomes(principal, items, rows[:n], saga))
    except Exception:
        # the claim is committed, but the call answers an error (a replay read failed): its runs
        # go back now instead of waiting RUNNING for their lease to expire
        await hand_back_undelivered(pool, claim.taken, worker_id, principal.actor, budget.ANSWER_FAILED)
        raise
    return outcomes, claim


def _params(principal: Principal, items: list[Item]) -> tuple[Any, ...]:
    return (
        [it.run_id for it in items],
        [it.attempt for it in items],
        [json.dumps(it.output, separators=(",", ":")) for it in items],
        list(COMPLETE.allowed),
        projects_with(principal, WORKER_ROLE),
        principal.actor,
    )


def _outcomes(
    principal: Principal, items: list[Item], rows: list[asyncpg.Record], saga: SagaNudger
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


def _refusal(principal: Principal, it: Item, row: asyncpg.Record, winner: int | None) -> errors.ServiceError:
    if row["cur_run_id"] is None:
        return errors.not_found("run", it.run_id)
    try:
        check_run_access(principal, row["cur_project"], WORKER_ROLE, it.run_id)
    except errors.ServiceError as err:
        return err
    cur: Row = row
    if winner is not None and winner < row["item"]:  # an earlier item of this batch completed the run
        cur = {**dict(row), "cur_status": RunStatus.COMPLETED.value}
    refusal = fenced_refusal(cur, it.run_id, it.attempt, COMPLETE.describe(cur))
    if replays.completed_by(cur, it.attempt):  # this lease completed it (earlier, or earlier in this batch)
        return _Replay(refusal, it.run_id)
    if refusal.reason == errors.LEASE_LOST:
        metrics.LEASE_LOST.labels("CompleteRuns").inc()
    return refusal
