"""ClaimRuns with long-poll: try to claim; when nothing is claimable, wait for a wake-up
(a NOTIFY for one of the projects), the end of the earliest retry backoff, or the end of
the wait, and try again. The wait never holds a store connection.

A claim is never interrupted half-way. When the call ends (the client cancels, its deadline
passes or its connection closes) gRPC cancels the handler; cancelling the claim's statement then
would have asyncpg send Postgres a cancel request that mostly arrives after the claim committed,
and the runs would stay RUNNING for a worker that never hears of them until their lease expires
(an attempt and the lease TTL lost). So the statement runs to its end, and what it claimed for a
caller that is gone is handed back at once (budget.hand_back: the attempt does not count). A
wait ends with the call, and no claim starts for a call that is already over."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import asyncpg

from services.common.audit import AUDIT_INSERT
from services.common.run_options import WAIT_KEY_BUSY, WAIT_RATE_LIMITED
from services.common.runs import RUN_READY_CHANNEL
from services.common.runstate import CLAIMABLE, TRANSITIONS, Action, Audit, RunStatus, attempts_left, sql_list
from services.scheduler import budget, metrics
from services.scheduler.fragments import RUN_COLUMNS_R
from services.scheduler.wakeup import RunReadyListener

# claimable now: queued, past any retry backoff, attempts left (the claim and the queue gauges)
CLAIMABLE_NOW = f"""status IN ({sql_list(TRANSITIONS[Action.CLAIM].allowed_from)})
       AND (not_before IS NULL OR not_before <= now())
       AND {attempts_left()}"""
# when a claimable run became claimable: its last state change (queued, re-queued, resumed) or
# the end of its retry backoff (GREATEST ignores a NULL not_before)
READY_SINCE = "GREATEST(updated_at, not_before)"


def not_paused(project_sql: str) -> str:
    """SQL: the project named by project_sql is not paused (PauseProject). A claim skips a paused
    project's runs, so the queue gauges and CountRuns do not count them as claimable either."""
    return f"NOT EXISTS (SELECT 1 FROM awooop_project_flow f WHERE f.project_id = {project_sql} AND f.paused)"
log = logging.getLogger("awooop.scheduler")
T = TypeVar("T")
# hand-backs still running after their handler was cancelled a second time (kept from the GC)
_settling: set[asyncio.Future[None]] = set()

# When a queued run became claimable: its not_before (a backoff or a requested delay), else its
# creation. The claim takes higher priority first, then the earliest due; awooop_run_claim_idx
# is (project_id, priority DESC, DUE), so the scan reads the runs in that order and stops after
# max_runs ready ones (runs due later sort after the ready ones of their priority).
DUE = "COALESCE(not_before, created_at)"
CLAIM_ORDER = f"priority DESC, {DUE}"


# Concurrency keys (docs/flow-control.md): a picked run is granted only when every one of its
# limited keys has a free slot and starts left in its rate window; then it takes one of each, all
# in this statement. The key rows are locked first, in key order (the release trigger of migration
# 0120 locks a run's keys in that order too, so claims and releases sharing keys never wait in a
# cycle), and the lock orders a claim parking runs behind a key against a release of that key.
# A greedy pass in claim order decides the picked runs with limited keys, one after the other
# (`greedy`: at most max_runs steps; runs of different projects never share a key, so the order
# within a project is the claim order). A run not granted is parked on a key that is full when the
# statement commits: behind a busy key (not_before 'infinity', wait_reason key_busy: after every
# ready run in the claim index, so later claims never scan it, until the trigger wakes it when
# the key frees a slot) or until the key's rate window ends (rate_limited).
# A key's rate window has ended: the claim opens a new one (starts counted from 0). Windows are
# fixed and timed by clock_timestamp() once the claim holds the key row, not by the transaction's
# start: a claim that waited for the lock must not count itself into a window that already ended.
_FRESH = """(l.rate_period IS NOT NULL
           AND (l.window_start IS NULL OR clock_timestamp() >= l.window_start + l.rate_period))"""

KEY_SLOTS = f"""
kp AS (
    SELECT p.run_id, p.project_id, u.key FROM picked p CROSS JOIN LATERAL unnest(p.ckeys) AS u(key)
     WHERE p.ckeys IS NOT NULL
),
lim AS MATERIALIZED (
    SELECT l.project_id, l.key, l.max_running, l.running, l.max_starts, l.rate_period, l.window_start,
           l.window_starts
      FROM awooop_concurrency_limit l
     WHERE (l.project_id, l.key) IN (SELECT project_id, key FROM kp)
     ORDER BY l.project_id, l.key
       FOR UPDATE
),
cap AS (
    -- per limited key: its place i, its window and what it can grant now (slots and starts left)
    SELECT l.*, row_number() OVER (ORDER BY l.project_id, l.key) AS i,
           greatest(0, least(l.max_running - l.running, l.max_starts - l.used)) AS cap
      FROM (SELECT l.*, CASE WHEN {_FRESH} THEN clock_timestamp() ELSE l.window_start END AS wstart,
                   CASE WHEN {_FRESH} THEN 0 ELSE l.window_starts END AS used
              FROM lim l) l
),
seq AS (
    -- the picked runs with limited keys in claim order (j), with the places of their keys
    SELECT kp.run_id, array_agg(c.i) AS idx,
           row_number() OVER (ORDER BY min(p.priority) DESC, min(p.due), kp.run_id) AS j
      FROM kp JOIN cap c ON c.project_id = kp.project_id AND c.key = kp.key
      JOIN picked p ON p.run_id = kp.run_id
     GROUP BY kp.run_id
),
greedy AS (
    -- caps: what each key can still grant after runs 1..j were decided
    SELECT 0::bigint AS j, (SELECT array_agg(cap ORDER BY i) FROM cap) AS caps, NULL::uuid AS run_id, true AS ok
    UNION ALL
    SELECT s.j,
           CASE WHEN t.ok THEN ARRAY(SELECT c - (x = ANY(s.idx))::int FROM unnest(g.caps) WITH ORDINALITY AS u(c, x)
                                      ORDER BY x)
                ELSE g.caps END,
           s.run_id, t.ok
      FROM greedy g JOIN seq s ON s.j = g.j + 1
     CROSS JOIN LATERAL (SELECT bool_and(g.caps[x] > 0) AS ok FROM unnest(s.idx) AS x) t
),
fin AS (
    -- per key: what the claim granted and what it can still grant
    SELECT c.*, c.cap - g.caps[c.i] AS granted, g.caps[c.i] AS left_over
      FROM cap c, (SELECT caps FROM greedy ORDER BY j DESC LIMIT 1) g
),
blocked AS (
    -- a run not granted waits on its first key that the claim leaves full
    SELECT DISTINCT ON (s.run_id) s.run_id, f.project_id, f.key,
           -- out of starts: parked until the window ends (a long-poll's timer wakes then)
           CASE WHEN f.used + f.granted >= f.max_starts THEN f.wstart + f.rate_period END AS window_end
      FROM greedy g JOIN seq s ON s.run_id = g.run_id
      JOIN fin f ON f.i = ANY(s.idx) AND f.left_over = 0
     WHERE NOT g.ok
     ORDER BY s.run_id, f.i
),
slots AS (
    UPDATE awooop_concurrency_limit k
       SET running = k.running + f.granted,
           window_start = f.wstart,
           window_starts = f.used + f.granted
      FROM fin f
     WHERE k.project_id = f.project_id AND k.key = f.key
       AND (f.granted > 0 OR f.wstart IS DISTINCT FROM f.window_start)
),
parked AS (
    UPDATE awooop_run_state r
       SET not_before = COALESCE(b.window_end, 'infinity'),
           wait_reason = CASE WHEN b.window_end IS NULL THEN '{WAIT_KEY_BUSY}' ELSE '{WAIT_RATE_LIMITED}' END,
           wait_key = b.key
      FROM blocked b
     WHERE r.run_id = b.run_id
 RETURNING r.run_id
),
relayed AS (
    -- A run parked here on another key may have been woken for one of its keys that still has
    -- room: that key's wake-up passes on to as many of its parked runs (the NOTIFY is sent once
    -- per project and transaction, so the RETURNING list sends it).
    UPDATE awooop_run_state r
       SET not_before = NULL, wait_reason = NULL, wait_key = NULL
     WHERE r.run_id IN (
            SELECT w.run_id
              FROM (SELECT f.project_id, f.key, least(f.left_over, count(*)) AS n
                      FROM blocked b JOIN seq s ON s.run_id = b.run_id JOIN fin f ON f.i = ANY(s.idx)
                     WHERE f.left_over > 0 AND f.max_running IS NOT NULL
                     GROUP BY f.project_id, f.key, f.left_over) x
             CROSS JOIN LATERAL (
                    SELECT q.run_id FROM awooop_run_state q
                     WHERE q.project_id = x.project_id AND q.wait_key = x.key AND q.status IN ({sql_list(CLAIMABLE)})
                       AND q.not_before = 'infinity'
                     ORDER BY q.priority DESC, q.created_at
                     LIMIT x.n
                       FOR UPDATE SKIP LOCKED) w)
 RETURNING pg_notify('{RUN_READY_CHANNEL}', r.project_id)
),
go AS (
    SELECT p.run_id, p.from_status, p.ready_since FROM picked p
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.run_id = p.run_id)
),"""


def claim_ctes(
    projects: str, max_runs: int, lease_secs: str, worker_id: str, actor: str, *, single: bool, after: str = ""
) -> str:
    """CTEs `picked`, `claimed` (the claimed rows, RUN_COLUMNS, from_status and claim_wait: seconds
    since the run became claimable) and
    `claim_aud` (their CLAIMED audit rows), with the given SQL for each parameter.

    An ordered scan of awooop_run_claim_idx per project that stops after max_runs unlocked
    rows (equality on project_id keeps the index order, so the cost does not grow with the
    backlog; `project_id = ANY(...)` would sort every pending run of the projects on each
    claim). single: projects is one project (text), the scan's rows are the claim; else
    projects is text[], one lateral scan per project, then max_runs of those interleaved by
    the projects' weights (rows locked by the lateral scans but not kept are released when the
    statement's transaction ends).

    max_runs is written into the text, not passed as a parameter: with it and a single
    project, the plan Postgres builds without the parameters' values is the one it builds with
    them, so it keeps that generic plan and stops planning the statement on every call (with a
    `LIMIT $n` it cannot estimate the claim's size, prefers a plan per call, and the planning
    costs about as much as executing it).

    after: a condition without columns, evaluated once before the scans start (a one-time
    filter); a statement that locks other rows first names them here, so the claim never
    holds a picked row while it waits for a lock."""
    n = int(max_runs)
    gate = f"\n       AND {after}" if after else ""
    ready = f"{CLAIMABLE_NOW}{gate}"
    if single:
        picked = f"""picked AS (
    SELECT run_id, status AS from_status, project_id, concurrency_keys AS ckeys, priority, {DUE} AS due,
           {READY_SINCE} AS ready_since
      FROM awooop_run_state
     WHERE project_id = {projects}::text
       AND {ready}
       AND {not_paused(f"{projects}::text")}
     ORDER BY {CLAIM_ORDER}
     LIMIT {n}
       FOR UPDATE SKIP LOCKED
)"""
    else:
        # Fairness: the k-th run of a project sorts at (k - 1 + e) / weight, e drawn per project
        # and claim from Exp(1): the first run goes to a project with probability weight / total
        # weight, and a claim of several runs interleaves the projects by weight, so a backlog in
        # one project never holds back another's runs.
        picked = f"""picked AS (
    SELECT run_id, from_status, project_id, ckeys, priority, due, ready_since
      FROM (SELECT c.run_id, c.from_status, p.project_id, c.ckeys, c.priority, c.due, c.ready_since, p.e, p.w,
                   row_number() OVER (PARTITION BY p.project_id ORDER BY c.priority DESC, c.due) AS k
              FROM (SELECT u.project_id, -ln(1.0 - random()) AS e, COALESCE(f.weight, 1) AS w
                      FROM unnest({projects}::text[]) AS u(project_id)
                      LEFT JOIN awooop_project_flow f ON f.project_id = u.project_id
                     WHERE f.paused IS NOT TRUE) p
             CROSS JOIN LATERAL (
                    SELECT run_id, status AS from_status, concurrency_keys AS ckeys, priority, {DUE} AS due,
                           {READY_SINCE} AS ready_since
                      FROM awooop_run_state
                     WHERE project_id = p.project_id
                       AND {ready}
                     ORDER BY {CLAIM_ORDER}
                     LIMIT {n}
                       FOR UPDATE SKIP LOCKED
                   ) c) t
     ORDER BY (t.k - 1 + t.e) / t.w
     LIMIT {n}
)"""
    return f"""{picked},{KEY_SLOTS}
claimed AS (
    UPDATE awooop_run_state r
       SET status = '{RunStatus.RUNNING}',
           lease_until = now() + make_interval(secs => {lease_secs}),
           heartbeat_at = now(),
           attempt_count = r.attempt_count + 1,
           worker_id = {worker_id},
           not_before = NULL,
           wait_reason = NULL,
           wait_key = NULL,
           updated_at = now()
      FROM go p
     WHERE r.run_id = p.run_id
 RETURNING {RUN_COLUMNS_R}, p.from_status,
           EXTRACT(EPOCH FROM clock_timestamp() - p.ready_since)::float8 AS claim_wait
),
claim_aud AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, {actor}, '{Audit.CLAIMED}', from_status, '{RunStatus.RUNNING}', NULL,
           jsonb_build_object('attempt', attempt_count, 'worker_id', worker_id, 'lease_until', lease_until)
      FROM claimed
)"""


@functools.lru_cache(maxsize=512)
def claim_sql(single: bool, max_runs: int) -> str:
    """$1 project (single) or projects, $2 lease seconds, $3 worker id, $4 actor."""
    return f"""
WITH RECURSIVE {claim_ctes("$1", max_runs, "$2", "$3", "$4", single=single)}
SELECT claimed.*, x.parked
  FROM (SELECT count(*) AS parked FROM parked) x
  LEFT JOIN claimed ON true
 ORDER BY claimed.priority DESC, claimed.created_at
"""


def projects_arg(projects: list[str]) -> tuple[bool, str | list[str]]:
    """(single, the value of the projects parameter) for claim_ctes."""
    return (True, projects[0]) if len(projects) == 1 else (False, projects)


# When nothing is claimable: seconds until the earliest retry backoff of these projects ends
# (a long-polling claim re-checks then). Only run on the empty path.
NEXT_READY_SQL = f"""
SELECT EXTRACT(EPOCH FROM min(not_before) - now())::float8
  FROM awooop_run_state
 WHERE status IN ({sql_list(CLAIMABLE)}) AND project_id = ANY($1::text[]) AND not_before > now()
   AND not_before < 'infinity'
"""


# claim statements in a row that may park runs behind full keys before one claims or finds none
MAX_PARKING_ROUNDS = 5


async def claim(
    pool: asyncpg.Pool, projects: list[str], max_runs: int, lease_ttl: float, worker_id: str, actor: str
) -> list[asyncpg.Record]:
    single, arg = projects_arg(projects)
    sql = claim_sql(single, max_runs)
    for _ in range(MAX_PARKING_ROUNDS):
        try:
            rows = await pool.fetch(sql, arg, lease_ttl, worker_id, actor)
        except asyncpg.exceptions.DeadlockDetectedError:
            continue  # two claims locking several keys in opposite orders; nothing was changed
        claimed = [r for r in rows if r["run_id"] is not None]
        if claimed or not rows or not rows[0]["parked"]:
            return claimed
        # everything picked was parked behind full keys: the runs after them may be claimable
    return []


async def seconds_until_ready(pool: asyncpg.Pool, projects: list[str]) -> float | None:
    """Seconds until the earliest backoff of these projects ends; None when none is pending."""
    value = await pool.fetchval(NEXT_READY_SQL, projects)
    return None if value is None else max(0.0, float(value))


def _cancel_requested() -> bool:
    """The running task (the RPC's handler) was asked to stop: its call is over."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _give_back(
    pool: asyncpg.Pool, rows: Sequence[asyncpg.Record], worker_id: str, actor: str, reason: str = budget.CALLER_GONE
) -> None:
    try:
        back = await budget.hand_back(pool, rows, worker_id, actor, reason)
    except Exception:
        log.warning("could not hand back %d runs claimed for a gone caller; the reaper takes them", len(rows))
        return
    metrics.CLAIM_UNDELIVERED.inc(back)


async def _settle(aw: Awaitable[None]) -> None:
    """Awaits aw, which goes on to its end even if the caller is cancelled (again) meanwhile."""
    settle = asyncio.ensure_future(aw)
    _settling.add(settle)
    settle.add_done_callback(_settling.discard)
    with contextlib.suppress(asyncio.CancelledError):  # cancelled again: it finishes on its own
        await asyncio.shield(settle)


async def hand_back_undelivered(
    pool: asyncpg.Pool, rows: Sequence[asyncpg.Record], worker_id: str, actor: str, reason: str = budget.CALLER_GONE
) -> None:
    """Hands back claimed rows whose call ended before they were answered (cancellation-proof)."""
    if rows:
        await _settle(_give_back(pool, rows, worker_id, actor, reason))


async def _hand_back_when_done(
    pool: asyncpg.Pool,
    task: asyncio.Future[T],
    claimed: Callable[[T], Sequence[asyncpg.Record]],
    worker_id: str,
    actor: str,
) -> None:
    """Waits for the claim of a call that ended, then hands back what it claimed."""
    try:
        result = await task
    except Exception:  # the statement failed: it claimed nothing
        return
    rows = claimed(result)
    if rows:
        await _give_back(pool, rows, worker_id, actor)


async def to_the_end(
    pool: asyncpg.Pool,
    work: Callable[[], Awaitable[T]],
    claimed: Callable[[T], Sequence[asyncpg.Record]],
    worker_id: str,
    actor: str,
) -> T:
    """Runs work() (a statement that claims; claimed(result) are its claimed rows) unless the
    call is already over, and to its end even when the call ends meanwhile: then its runs are
    handed back and the cancellation goes on (see the module's docstring)."""
    if _cancel_requested():
        metrics.CLAIMS_ABANDONED.inc()
        raise asyncio.CancelledError
    task = asyncio.ensure_future(work())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        metrics.CLAIMS_ABANDONED.inc()
        await _settle(_hand_back_when_done(pool, task, claimed, worker_id, actor))
        raise


def _rows(rows: list[asyncpg.Record]) -> list[asyncpg.Record]:
    return rows


async def claim_runs(
    pool: asyncpg.Pool,
    listener: RunReadyListener,
    *,
    projects: list[str],
    max_runs: int,
    lease_ttl: float,
    worker_id: str,
    actor: str,
    wait: float,
    gone: Callable[[], bool] = lambda: False,
) -> list[asyncpg.Record]:
    """Claims up to max_runs; waits up to `wait` seconds for work. Returns [] when the wait
    ends empty (or the service is stopping, or gone() says the call is over: its deadline
    passed). Cancelled (the call ended), it stops waiting at once and claims nothing."""
    deadline = time.monotonic() + wait
    while True:
        with listener.subscribe(projects) as woken:
            if gone():
                return []
            rows = await to_the_end(
                pool,
                lambda: claim(pool, projects, max_runs, lease_ttl, worker_id, actor),
                _rows,
                worker_id,
                actor,
            )
            if rows:
                metrics.count_claims(rows)
                return rows
            left = deadline - time.monotonic()
            if left <= 0 or listener.stopping.is_set():
                return []
            timeout = left
            next_ready = await seconds_until_ready(pool, projects)
            if next_ready is not None:
                timeout = min(timeout, next_ready + 0.001)
            poll = listener.poll_interval
            if poll is not None:
                timeout = min(timeout, poll)
            metrics.CLAIMS_WAITING.inc()
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(woken.wait(), timeout=timeout)
            except asyncio.CancelledError:  # the call ended while it waited
                metrics.CLAIMS_ABANDONED.inc()
                raise
            finally:
                metrics.CLAIMS_WAITING.dec()
