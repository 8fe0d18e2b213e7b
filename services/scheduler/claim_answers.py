"""Idempotent claims: a ClaimRuns that carries a claim id (ClaimRunsRequest.claim_id) records its
answer in its own statement, so a retry of a claim whose answer was lost (a client deadline, a
dropped connection, a scheduler that died after the commit) answers the same leases at once
instead of claiming more and leaving the first runs RUNNING until their lease expires.

The claim statement (claiming.claim_ctes with `answered`) gains two CTEs:

- `prior`: the answer already recorded for (principal, worker id, claim id), one primary-key
  probe; when there is one, the claim's scans do not start (a one-time filter) and the
  statement reports it (`recorded`), and the call answers replay() instead;
- `recorded`: the claimed runs as (run_id, attempt) pairs and the claim's parameters, inserted
  only when the claim took runs (an empty claim records nothing, so a long-poll's next round or
  a retry claims as usual).

Concurrent calls with one claim id (retries racing their first attempt) each claim other runs
(SKIP LOCKED), and the second INSERT of the key waits for the first call's commit and then fails
as a unique violation, which aborts that statement whole: nothing of it is claimed. The call
runs the statement again (recorded_meanwhile), and now `prior` sees the first call's answer.

A replay writes nothing: it answers the recorded runs that still hold the recorded lease (same
attempt, still RUNNING or WAITING_TOOL, same worker), with their lease_until as renewed since;
runs completed, failed, released, handed back or reaped since are left out. Answers are kept
until the lease they granted would have expired unrenewed (expires_at) and then pruned
(prune(), the scheduler's retention loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from services.common import errors
from services.common.runstate import LEASED, sql_list
from services.scheduler.fragments import RUN_COLUMNS_R

TABLE = "awooop_claim_answer"
PRIMARY_KEY = f"{TABLE}_pkey"

# the claim's scans start only when no answer is recorded for its key yet
NOT_RECORDED = "NOT EXISTS (SELECT 1 FROM prior)"
# the statement's report that an answer was recorded before it (it then claimed nothing)
RECORDED = "EXISTS (SELECT 1 FROM prior) AS recorded"


@dataclass(frozen=True, slots=True)
class ClaimKey:
    """A claim id in its scope (the principal's actor "type:id" and the worker id) and the
    parameters of the claim it names (projects sorted and distinct)."""

    principal: str
    worker_id: str
    claim_id: str
    projects: tuple[str, ...]
    max_runs: int
    lease_ttl: float

    def params(self) -> tuple[Any, ...]:
        """The values of the statement parameters named by answer_ctes' principal, claim_id and
        projects (in that order)."""
        return self.principal, self.claim_id, list(self.projects)


def answer_ctes(
    *, principal: str, claim_id: str, projects: str, worker_id: str, max_runs: int, lease_secs: str
) -> tuple[str, str]:
    """(`prior`, `recorded`): the CTE reading the key's recorded answer (put it before `picked`)
    and the one recording this claim's answer (after `claimed`), with the given SQL for each
    parameter (max_runs: written into the text, as the claim's own LIMIT)."""
    prior = f"""prior AS MATERIALIZED (
    SELECT 1 FROM {TABLE}
     WHERE principal = {principal}::text AND worker_id = {worker_id} AND claim_id = {claim_id}::text
)"""
    recorded = f"""recorded AS (
    INSERT INTO {TABLE} (principal, worker_id, claim_id, project_ids, max_runs, lease_ttl, run_ids, attempts,
                         expires_at)
    SELECT {principal}::text, {worker_id}, {claim_id}::text, {projects}::text[], {int(max_runs)}, {lease_secs},
           array_agg(run_id), array_agg(attempt_count), now() + make_interval(secs => {lease_secs})
      FROM claimed
    HAVING count(*) > 0
)"""
    return prior, recorded


def recorded_meanwhile(err: asyncpg.exceptions.UniqueViolationError) -> bool:
    """The claim statement failed because a concurrent call of the same claim id recorded its
    answer first: the statement changed nothing, and run again it replays that answer."""
    return getattr(err, "constraint_name", None) == PRIMARY_KEY


# The recorded answer's parameters, and its runs that still hold the lease it granted, in the
# claim's answer order (as claiming.claim_sql). One row with NULL run columns when none does.
REPLAY_SQL = f"""
SELECT a.project_ids AS first_projects, a.max_runs AS first_max_runs, a.lease_ttl AS first_lease_ttl,
       a.created_at AS first_claimed_at, c.*
  FROM {TABLE} a
  LEFT JOIN LATERAL (
       SELECT {RUN_COLUMNS_R}, NULL::text AS from_status, NULL::float8 AS claim_wait
         FROM unnest(a.run_ids, a.attempts) AS t(run_id, attempt)
         JOIN awooop_run_state r ON r.run_id = t.run_id
        WHERE r.attempt_count = t.attempt AND r.status IN ({sql_list(LEASED)}) AND r.worker_id = a.worker_id
  ) c ON true
 WHERE a.principal = $1 AND a.worker_id = $2 AND a.claim_id = $3
 ORDER BY c.priority DESC, c.created_at
"""


async def replay(pool: asyncpg.Pool, key: ClaimKey) -> list[asyncpg.Record]:
    """The runs of the key's recorded answer that still hold its leases (claimed rows without
    from_status and claim_wait). A claim id first used with other parameters is refused with
    IDEMPOTENCY_CONFLICT; an answer pruned meanwhile answers no runs."""
    rows = await pool.fetch(REPLAY_SQL, key.principal, key.worker_id, key.claim_id)
    if not rows:
        return []
    first = rows[0]
    differs = [
        name
        for name, was, now in (
            ("project_ids", list(first["first_projects"]), list(key.projects)),
            ("max_runs", first["first_max_runs"], key.max_runs),
            ("lease_ttl", first["first_lease_ttl"], key.lease_ttl),
        )
        if was != now
    ]
    if differs:
        raise errors.idempotency_conflict(
            f"claim id {key.claim_id} was first used for a claim with other {', '.join(differs)}; "
            "use a new claim id for a new claim",
            claim_id=key.claim_id,
            differs=",".join(differs),
            first_seen_at=first["first_claimed_at"].isoformat(),
        )
    return [r for r in rows if r["run_id"] is not None]


# Answers whose lease would have expired unrenewed: a batch per statement, picked with SKIP
# LOCKED so that replicas prune disjoint rows. $1 batch size.
PRUNE_SQL = f"""
DELETE FROM {TABLE}
 WHERE (principal, worker_id, claim_id) IN (
        SELECT principal, worker_id, claim_id FROM {TABLE}
         WHERE expires_at < now()
         LIMIT $1
           FOR UPDATE SKIP LOCKED)
"""

MAX_BATCHES_PER_PASS = 20


async def prune(pool: asyncpg.Pool, *, batch: int) -> int:
    """Deletes expired claim answers (at most MAX_BATCHES_PER_PASS batches); the number deleted."""
    total = 0
    for _ in range(MAX_BATCHES_PER_PASS):
        status = await pool.execute(PRUNE_SQL, batch)
        n = int(status.split()[-1])
        total += n
        if n < batch:
            break
    return total
