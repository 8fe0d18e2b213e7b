"""Idempotent claims: a ClaimRuns that carries a claim id (ClaimRunsRequest.claim_id) records its
answer in its own statement, so a retry of a claim whose answer was lost (a client deadline, a
dropped connection, a scheduler that died after the commit) answers the same leases at once
instead of claiming more and leaving the first runs RUNNING until their lease expires.

Every claim statement of claims.sql has two CTEs for it:

- `prior`: the answer already recorded for (principal, worker id, claim id), one primary-key
  probe; when there is one, the claim's scans do not start (a one-time filter) and the
  statement reports it (`recorded`), and the call answers replay() instead;
- `recorded`: the claimed runs as (run_id, attempt) pairs and the claim's parameters, inserted
  only when the claim carries a claim id and took runs (an empty claim records nothing, so a
  long-poll's next round or a retry claims as usual).

A claim without a claim id runs the same statement with the key's parameters NULL (NO_KEY).

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
from services.scheduler import claims_sql

TABLE = "awooop_claim_answer"
PRIMARY_KEY = f"{TABLE}_pkey"
# the claim statements' key parameters of a claim without a claim id
NO_KEY: dict[str, Any] = {"principal": None, "claim_id": None, "sorted_projects": None}


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

    def params(self) -> dict[str, Any]:
        """The claim statements' key parameters (NO_KEY's names)."""
        return {"principal": self.principal, "claim_id": self.claim_id, "sorted_projects": list(self.projects)}


def recorded_meanwhile(err: asyncpg.exceptions.UniqueViolationError) -> bool:
    """The claim statement failed because a concurrent call of the same claim id recorded its
    answer first: the statement changed nothing, and run again it replays that answer."""
    return getattr(err, "constraint_name", None) == PRIMARY_KEY


async def replay(pool: asyncpg.Pool, key: ClaimKey) -> list[claims_sql.ReplayClaimAnswerRow]:
    """The runs of the key's recorded answer that still hold its leases (claimed rows without
    from_status and claim_wait). A claim id first used with other parameters is refused with
    IDEMPOTENCY_CONFLICT; an answer pruned meanwhile answers no runs."""
    rows = await claims_sql.replay_claim_answer(
        pool, principal=key.principal, worker_id=key.worker_id, claim_id=key.claim_id
    )
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


MAX_BATCHES_PER_PASS = 20


async def prune(pool: asyncpg.Pool, *, batch: int) -> int:
    """Deletes expired claim answers (at most MAX_BATCHES_PER_PASS batches); the number deleted."""
    total = 0
    for _ in range(MAX_BATCHES_PER_PASS):
        status = await claims_sql.prune_claim_answers(pool, batch=batch)
        n = int(status.split()[-1])
        total += n
        if n < batch:
            break
    return total
