"""Answers that fit the message limit (AWOOOP_MAX_MESSAGE_BYTES).

Every single run fits one answer: its input and output are each at most
AWOOOP_MAX_PAYLOAD_BYTES as JSON and encoded (services/common/jsonvalues.py), and the start-up
check (settings.deliverability_problem) keeps the message limit above two payloads plus the
other fields. Many runs may not, so:

- ClaimRuns takes the runs its answer has room for, oldest first, and hands the others back at
  once (a ReleaseRun in the scheduler's name: the attempt does not count, the run is claimable
  again, the next claim gets it). Before this, an answer over the limit failed in transport
  after the claim committed, and the runs were reaped until their attempts ran out without
  ever having run.
- ListRuns ends its page at the last run that fits (next_page_token continues after it).
- GetRunHistory answers RESOURCE_EXHAUSTED / HISTORY_TOO_LARGE instead of failing in transport.
- CompleteRuns (and ClaimRuns.complete) answer every item; past the budget a completed run is
  returned without its input and output (the caller has them; GetRun reads them), so a large
  batch never makes its own answer undeliverable after its writes committed.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from services.common.db import fetch_again_on_deadlock
from services.common.runs import RUN_READY_CHANNEL

# GetRunHistory past the limit (it has no pages: a run's history is short unless its reasons are huge)
HISTORY_TOO_LARGE = "HISTORY_TOO_LARGE"

# room for the answer's other fields, framing and trailers
HEADROOM = 16 * 1024
# per repeated item: tag, length prefix
ITEM_FRAMING = 8


def answer_budget(max_message_bytes: int) -> int:
    return max(0, max_message_bytes - HEADROOM)


def fit_claimed(claimed: Sequence[scheduler_pb2.ClaimedRun], budget: int) -> int:
    """How many of claimed (oldest first) fit in budget bytes (one always fits an empty
    answer: settings.deliverability_problem)."""
    used = 0
    for i, c in enumerate(claimed):
        used += c.ByteSize() + ITEM_FRAMING
        if used > budget:
            return i
    return len(claimed)


def fit_runs(runs: Sequence[common_pb2.Run], budget: int) -> int:
    """How many of runs (in page order) fit in budget bytes; at least one when any is given."""
    used = 0
    for i, r in enumerate(runs):
        used += r.ByteSize() + ITEM_FRAMING
        if used > budget and i > 0:
            return i
    return len(runs)


def trim_results(results: Sequence[scheduler_pb2.CompleteRunResult], budget: int) -> int:
    """Clears input and output of the completed runs past budget (in item order); returns
    the bytes the results use afterwards."""
    used = 0
    for r in results:
        size = r.ByteSize() + ITEM_FRAMING
        if used + size > budget and r.HasField("run"):
            r.run.ClearField("input")
            r.run.ClearField("output")
            size = r.ByteSize() + ITEM_FRAMING
        used += size
    return used


# Why claimed runs were not delivered (the audit reason of their hand-back)
NO_ROOM = "not delivered: the claim's answer had no room left (AWOOOP_MAX_MESSAGE_BYTES)"
ANSWER_FAILED = "not delivered: the claiming call answered an error after the claim committed"
CALLER_GONE = "not delivered: the claiming call ended first (cancelled, deadline passed or connection closed)"

# Runs claimed but not delivered (left out of the answer, or their caller is gone), handed back in
# one statement: as a ReleaseRun would (released_count + 1: the attempt does not count), to the
# status they were claimed from. $1 run ids, $2 attempts, $3 their statuses before the claim,
# $4 worker id, $5 actor, $6 the reason. A run whose cancel was requested in between is left to
# the reaper (which ends it as cancelled).
HAND_BACK_SQL = f"""
WITH t AS (
    SELECT * FROM unnest($1::uuid[], $2::int[], $3::text[]) AS t(run_id, attempt, from_status)
),
upd AS (
    UPDATE awooop_run_state r
       SET status = t.from_status, released_count = r.released_count + 1,
           lease_until = NULL, worker_id = NULL, not_before = NULL, updated_at = now()
      FROM t
     WHERE r.run_id = t.run_id AND r.attempt_count = t.attempt AND r.worker_id = $4
       AND r.status = 'RUNNING' AND NOT r.cancel_requested
 RETURNING r.run_id, r.project_id, r.attempt_count, r.status
),
aud AS (
    INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)
    SELECT project_id, run_id, $5, 'RELEASED', 'RUNNING', status, $6::text,
           jsonb_build_object('attempt', attempt_count, 'worker_id', $4::text)
      FROM upd
),
notified AS (
    SELECT count(pg_notify('{RUN_READY_CHANNEL}', project_id)) AS n FROM (SELECT DISTINCT project_id FROM upd) p
)
SELECT (SELECT count(*) FROM upd) AS handed_back, (SELECT n FROM notified) AS notified
"""


async def hand_back(
    pool: asyncpg.Pool, rows: Sequence[asyncpg.Record], worker_id: str, actor: str, reason: str = NO_ROOM
) -> int:
    """Returns claimed rows that were not delivered to the queue; the number handed back."""
    if not rows:
        return 0
    # the runs give their keys' slots back in row order: a deadlock aborts the statement whole
    got = await fetch_again_on_deadlock(
        pool,
        HAND_BACK_SQL,
        [r["run_id"] for r in rows],
        [r["attempt_count"] for r in rows],
        [r["from_status"] for r in rows],
        worker_id,
        actor,
        reason,
    )
    return int(got[0]["handed_back"]) if got else 0
