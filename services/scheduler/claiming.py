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
from typing import NamedTuple, TypeVar

import asyncpg

from services.common.audit import AUDIT_INSERT
from services.common.run_options import WAIT_KEY_BUSY, WAIT_RATE_LIMITED
from services.common.runstate import CLAIMABLE, TRANSITIONS, Action, Audit, RunStatus, attempts_left, sql_list
from services.common.server_plans import keep_plan
from services.scheduler import budget, claim_answers, metrics
from services.scheduler.claim_answers import ClaimKey
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
# limited keys has a free slot and starts left in its rate window; then it takes one of each.
# awooop_grant_keys (migration 0120) locks the picked runs' limited keys in key order, decides
# them in claim order, writes the keys' counts and returns the runs it refused, each with the key
# it waits on; a claim whose picked runs carry no keys does not call it. A refused run is parked:
# behind a busy key (not_before 'infinity', wait_reason key_busy: after every ready run in the
# claim index, so later claims never scan it, until the trigger of migration 0120 wakes it when
# the key frees a slot) or until the key's rate window ends (rate_limited). The key rows' locks
# order this claim against a release of the same keys, so a run is never parked behind a key
# that has room.
_KEY_ORDER = "priority DESC, due, run_id"

KEY_SLOTS = f"""
blocked AS (
    SELECT b.b_run AS run_id, b.b_key AS key, b.b_until AS window_end
      FROM (SELECT array_agg(run_id ORDER BY {_KEY_ORDER}) AS runs,
                   array_agg(project_id ORDER BY {_KEY_ORDER}) AS projects,
                   array_agg(array_to_string(ckeys, ' ') ORDER BY {_KEY_ORDER}) AS keys
              FROM picked WHERE ckeys IS NOT NULL) a
     CROSS JOIN LATERAL awooop_grant_keys(a.runs, a.projects, a.keys) AS b
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
go AS (
    SELECT p.run_id, p.from_status, p.ready_since FROM picked p
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.run_id = p.run_id)
),"""


def claim_ctes(
    projects: str,
    max_runs: int,
    lease_secs: str,
    worker_id: str,
    actor: str,
    *,
    count: int,
    after: str = "",
    answered: tuple[str, str] | None = None,
) -> str:
    """CTEs `picked`, `claimed` (the claimed rows, RUN_COLUMNS, from_status and claim_wait: seconds
    since the run became claimable) and
    `claim_aud` (their CLAIMED audit rows), with the given SQL for each parameter.

    answered: the SQL of the principal and the claim id of a claim that carries one (its sorted
    projects follow them as a text[] parameter: claim_answers.ClaimKey.params); adds the CTEs
    `prior` (the answer recorded for that claim id: when there is one, nothing is claimed) and
    `recorded` (this claim's answer), see claim_answers.

    An ordered scan of awooop_run_claim_idx per project that stops after max_runs unlocked
    rows (equality on project_id keeps the index order, so the cost does not grow with the
    backlog; `project_id = ANY(...)` would sort every pending run of the projects on each
    claim). count 1: projects is one project (text), the scan's rows are the claim; else
    projects is a text[] of `count` distinct projects, one lateral scan per project, then
    max_runs of those interleaved by the projects' weights (rows locked by the lateral scans but
    not kept are released when the statement's transaction ends).

    max_runs is written into the text, not passed as a parameter: with it and a single
    project, the plan Postgres builds without the parameters' values is the one it builds with
    them, so it keeps that generic plan and stops planning the statement on every call (with a
    `LIMIT $n` it cannot estimate the claim's size, prefers a plan per call, and the planning
    costs about as much as executing it). For the same reason the projects' unnest carries
    `LIMIT count` (it never cuts: the array holds exactly count): a generic plan otherwise
    estimates 10 projects, costs their lateral scans against the custom plan's 2 or 3, and on
    some statistics Postgres then plans the multi-project claim on every call (measured: 1.0
    against 0.55 ms a claim, bench flow).

    after: a condition without columns, evaluated once before the scans start (a one-time
    filter); a statement that locks other rows first names them here, so the claim never
    holds a picked row while it waits for a lock."""
    n = int(max_runs)
    prior = recorded = ""
    if answered is not None:
        principal, claim_id = answered
        prior, recorded = claim_answers.answer_ctes(
            principal=principal,
            claim_id=claim_id,
            projects=_next_param(claim_id),
            worker_id=worker_id,
            max_runs=n,
            lease_secs=lease_secs,
        )
        prior += ",\n"
        recorded = ",\n" + recorded
        after = f"{after} AND {claim_answers.NOT_RECORDED}" if after else claim_answers.NOT_RECORDED
    gate = f"\n       AND {after}" if after else ""
    ready = f"{CLAIMABLE_NOW}{gate}"
    if count == 1:
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
                      FROM (SELECT * FROM unnest({projects}::text[]) LIMIT {int(count)}) AS u(project_id)
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
    return f"""{prior}{picked},{KEY_SLOTS}
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
){recorded}"""


def _next_param(param: str) -> str:
    """$n -> $n+1."""
    return f"${int(param.removeprefix('$')) + 1}"


@functools.lru_cache(maxsize=512)
def claim_sql(count: int, max_runs: int, *, answered: bool = False) -> str:
    """$1 project (count 1) or `count` projects, $2 lease seconds, $3 worker id, $4 actor; answered
    (a claim with a claim id): $5 principal, $6 claim id, $7 sorted projects, and every row
    carries `recorded` (an answer was recorded for the claim id before: nothing was claimed)."""
    answer = ("$5", "$6") if answered else None
    recorded = f", {claim_answers.RECORDED}" if answered else ""
    return keep_plan(f"""
WITH {claim_ctes("$1", max_runs, "$2", "$3", "$4", count=count, answered=answer)}
SELECT claimed.*, x.*
  FROM (SELECT count(*) AS parked{recorded} FROM parked) x
  LEFT JOIN claimed ON true
 ORDER BY claimed.priority DESC, claimed.created_at
""")


def projects_arg(projects: list[str]) -> tuple[int, str | list[str]]:
    """(count, the value of the projects parameter) for claim_ctes; projects are distinct."""
    return (1, projects[0]) if len(projects) == 1 else (len(projects), projects)


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


class Claim(NamedTuple):
    """What a claim answers: the runs it claimed, or (replayed) the runs an earlier claim with the
    same claim id claimed that still hold its leases (claim_answers.replay)."""

    rows: list[asyncpg.Record]
    replayed: bool = False

    @property
    def taken(self) -> list[asyncpg.Record]:
        """The runs this call claimed (to hand back if they are not delivered): a replay took none."""
        return [] if self.replayed else self.rows


async def claim(
    pool: asyncpg.Pool, projects: list[str], max_runs: int, lease_ttl: float, worker_id: str, actor: str
) -> list[asyncpg.Record]:
    """A claim without a claim id: the claimed rows."""
    return (await claim_once(pool, projects, max_runs, lease_ttl, worker_id, actor)).rows


async def claim_once(
    pool: asyncpg.Pool,
    projects: list[str],
    max_runs: int,
    lease_ttl: float,
    worker_id: str,
    actor: str,
    key: ClaimKey | None = None,
) -> Claim:
    """One claim (up to MAX_PARKING_ROUNDS statements while runs get parked); with a claim key,
    the answer recorded for its claim id when there is one."""
    count, arg = projects_arg(projects)
    sql = claim_sql(count, max_runs, answered=key is not None)
    params = (arg, lease_ttl, worker_id, actor, *(key.params() if key is not None else ()))
    for _ in range(MAX_PARKING_ROUNDS):
        try:
            rows = await pool.fetch(sql, *params)
        except asyncpg.exceptions.DeadlockDetectedError:
            continue  # two claims locking several keys in opposite orders; nothing was changed
        except asyncpg.exceptions.UniqueViolationError as err:
            if key is not None and claim_answers.recorded_meanwhile(err):
                continue  # nothing was changed; the next statement replays the answer recorded meanwhile
            raise
        if key is not None and rows and rows[0]["recorded"]:
            return Claim(await claim_answers.replay(pool, key), replayed=True)
        claimed = [r for r in rows if r["run_id"] is not None]
        if claimed or not rows or not rows[0]["parked"]:
            return Claim(claimed)
        # everything picked was parked behind full keys: the runs after them may be claimable
    return Claim([])


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


def _taken(result: Claim) -> list[asyncpg.Record]:
    return result.taken


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
    key: ClaimKey | None = None,
) -> Claim:
    """Claims up to max_runs; waits up to `wait` seconds for work. Answers no runs when the
    wait ends empty (or the service is stopping, or gone() says the call is over: its deadline
    passed). Cancelled (the call ended), it stops waiting at once and claims nothing. With a
    claim key whose answer is recorded, that answer, at once (even with no runs left in it)."""
    deadline = time.monotonic() + wait
    while True:
        with listener.subscribe(projects) as woken:
            if gone():
                return Claim([])
            result = await to_the_end(
                pool,
                lambda: claim_once(pool, projects, max_runs, lease_ttl, worker_id, actor, key),
                _taken,
                worker_id,
                actor,
            )
            if result.replayed:
                metrics.CLAIM_REPLAYS.inc()
                return result
            if result.rows:
                metrics.count_claims(result.rows)
                return result
            left = deadline - time.monotonic()
            if left <= 0 or listener.stopping.is_set():
                return result
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
