"""The stale-lease reaper (seed 000 D3): RUNNING / WAITING_TOOL runs whose lease expired go
back to PENDING while attempts are left, else FAILED "Max retry attempts exceeded"; a run
with a pending cancel becomes CANCELLED instead. WAITING_APPROVAL holds no lease and is
never touched.

One statement per batch: the CTE picks expired leases with FOR UPDATE SKIP LOCKED (replicas
take disjoint rows and never wait on a worker's write). Locking re-checks expiry in this same
statement: a row whose heartbeat committed after our snapshot is re-read at its newest
version and dropped when `lease_until < now()` no longer holds (READ COMMITTED re-evaluation),
and once locked nobody can renew it before the UPDATE. The audit rows, compensation requests
and wake-up NOTIFY are written by the same statement. The scan reads awooop_run_leased_idx
(partial: leased runs only, keyed by run_id so that heartbeats are HOT updates; expiry is
checked on the row) and the UPDATE joins by primary key, so its cost grows with the leases
held, not with finished runs. (Repeating the status/expiry filter in the UPDATE made the planner join
through the partial index instead, a nested loop of batch x batch rows: 6x slower at 1M
finished runs.)
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg

from services.common import loops, retry_policy
from services.common.audit import AUDIT_INSERT
from services.common.db import fetch_again_on_deadlock
from services.common.run_options import WAIT_BACKOFF
from services.common.runs import RUN_READY_CHANNEL
from services.common.runstate import DROP_LEASE, LEASED, TRANSITIONS, Action, RunStatus, attempts_left, sql_list
from services.scheduler import metrics
from services.scheduler.fragments import comp_audit_rows, compensation_cte, notify_cte
from services.scheduler.saga_client import SagaNudger

LOOP = "scheduler.reaper"
REAPER_ACTOR = "system:reaper"
REAP_BATCH = 1000
MAX_ATTEMPTS_REASON = "Max retry attempts exceeded"  # seed 000 D3
MAX_ATTEMPTS_CODE = "E-RUN-MAX-ATTEMPTS"

_ATTEMPTS_LEFT = attempts_left("r")
_REAP = TRANSITIONS[Action.REAP]

# A reaped lease counts as a failure of its attempt: while attempts are left the run waits the
# backoff its retry policy gives that many attempts used, as after a retryable FailRun, so a
# handler that crashes its worker every time backs off too.
_POLICY = retry_policy.effective_sql("s.project_id", "s.retry_policy", "$4")
_BACKOFF = retry_policy.delay_sql("e.policy", "r.attempt_count - r.released_count")

# $1 batch size, $2 actor, $3 the wake-up channel, $4 the service's retry policy (JSON text),
# $5 one run only (NULL: any; the pass's fallback when a batch failed for one run's data).
REAP_SQL = f"""
WITH expired AS (
    SELECT s.run_id, s.status, s.worker_id, s.lease_until, {_POLICY} AS policy
      FROM awooop_run_state s
     WHERE s.status IN ({sql_list(LEASED)}) AND s.lease_until < now() AND ($5::uuid IS NULL OR s.run_id = $5)
     LIMIT $1
       FOR UPDATE SKIP LOCKED
),
upd AS (
    UPDATE awooop_run_state r
       SET status = CASE WHEN r.cancel_requested THEN 'CANCELLED'
                         WHEN {_ATTEMPTS_LEFT} THEN 'PENDING'
                         ELSE 'FAILED' END,
           failure_reason = CASE WHEN r.cancel_requested THEN COALESCE(r.failure_reason, 'cancelled')
                                 WHEN {_ATTEMPTS_LEFT} THEN r.failure_reason
                                 ELSE '{MAX_ATTEMPTS_REASON}' END,
           error_code = CASE WHEN r.cancel_requested THEN NULL
                             WHEN {_ATTEMPTS_LEFT} THEN r.error_code
                             ELSE '{MAX_ATTEMPTS_CODE}' END,
           not_before = CASE WHEN NOT r.cancel_requested AND {_ATTEMPTS_LEFT}
                             THEN now() + make_interval(secs => {_BACKOFF}) END,
           wait_reason = CASE WHEN NOT r.cancel_requested AND {_ATTEMPTS_LEFT} THEN '{WAIT_BACKOFF}' END,
           {DROP_LEASE}, reaped_at = now(), updated_at = now()
      FROM expired e
     WHERE r.run_id = e.run_id
 RETURNING r.run_id, r.project_id, r.status, r.failure_reason, r.attempt_count, r.max_attempts,
           e.status AS from_status, e.worker_id AS prev_worker, e.lease_until AS prev_lease_until
){compensation_cte("CASE WHEN u.status = 'CANCELLED' THEN 'cancelled' ELSE 'step_failed' END")},
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, $2, {_REAP.audit_case()}, from_status, status,
           CASE status WHEN '{RunStatus.PENDING}' THEN 'lease expired'
                       WHEN '{RunStatus.CANCELLED}' THEN 'lease expired after a cancel request'
                       ELSE '{MAX_ATTEMPTS_REASON}' END,
           jsonb_build_object('attempt', attempt_count, 'max_attempts', max_attempts, 'worker_id', prev_worker,
                              'lease_until', prev_lease_until)
      FROM upd{comp_audit_rows("$2")}
){notify_cte("$3", "status = 'PENDING'")}
SELECT upd.run_id, upd.status, upd.failure_reason, comp.trigger, (SELECT n FROM notified) AS notified
  FROM upd LEFT JOIN comp USING (run_id)
"""

# the runs a batch would take, for reaping them one at a time
EXPIRED_SQL = f"""
SELECT run_id FROM awooop_run_state
 WHERE status IN ({sql_list(LEASED)}) AND lease_until < now()
 ORDER BY lease_until
 LIMIT $1
"""

_OUTCOME = {"PENDING": "requeued", "FAILED": "failed", "CANCELLED": "cancelled"}


@dataclass(frozen=True)
class ReapResult:
    requeued: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def total(self) -> int:
        return self.requeued + self.failed + self.cancelled


async def reap(
    pool: asyncpg.Pool, saga: SagaNudger, batch: int = REAP_BATCH, *, policy_defaults: str = "{}"
) -> ReapResult:
    """One reaper pass: takes back every expired lease, a batch per statement. policy_defaults:
    the service's retry policy as JSON (retry_policy.defaults). A batch that fails for one run's
    data is reaped again one run at a time, so that run is skipped (and noted on its history)
    and every other project's leases are still taken back."""
    counts = {"requeued": 0, "failed": 0, "cancelled": 0}

    async def statement(only: uuid.UUID | None, size: int) -> list[asyncpg.Record]:
        # the batch's runs give their keys' slots back in row order: a deadlock aborts it whole
        return await fetch_again_on_deadlock(
            pool, REAP_SQL, size, REAPER_ACTOR, RUN_READY_CHANNEL, policy_defaults, only
        )

    await loops.in_batches(
        LOOP, REAPER_ACTOR, pool, batch, statement, EXPIRED_SQL, lambda rows: _settle(rows, counts, saga)
    )
    return ReapResult(**counts)


def _settle(rows: list[asyncpg.Record], counts: dict[str, int], saga: SagaNudger) -> None:
    """Counts the reaped runs and nudges the saga service for those to compensate."""
    for r in rows:
        outcome = _OUTCOME[r["status"]]
        counts[outcome] += 1
        metrics.REAPED.labels(outcome).inc()
        if r["trigger"]:
            metrics.COMPENSATIONS.labels(r["trigger"]).inc()
            saga.nudge(str(r["run_id"]), r["trigger"], r["failure_reason"] or "")
