"""ClaimRuns with long-poll: try to claim; when nothing is claimable, wait for a wake-up
(a NOTIFY for one of the projects), the end of the earliest retry backoff, or the end of
the wait, and try again. The wait never holds a store connection.

A claim is never interrupted half-way. When the call ends (the client cancels, its deadline
passes or its connection closes) gRPC cancels the handler; cancelling the claim's statement then
would have asyncpg send Postgres a cancel request that mostly arrives after the claim committed,
and the runs would stay RUNNING for a worker that never hears of them until their lease expires
(an attempt and the lease TTL lost). So the statement runs to its end, and what it claimed for a
caller that is gone is handed back at once (hand_back.py: the attempt does not count). A
wait ends with the call, and no claim starts for a call that is already over.

The statements are claims.sql's (ClaimRuns, SecondsUntilReady): a claim is ClaimRuns with no
completions (NO_COMPLETIONS)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import asyncpg

from services.common import sql
from services.common.db import Row
from services.common.server_plans import keep_plan
from services.scheduler import claim_answers, claims_sql, hand_back, metrics
from services.scheduler.claim_answers import ClaimKey
from services.scheduler.wakeup import RunReadyListener
from services.scheduler.workers import NO_ROUTING, Routing


@functools.lru_cache(maxsize=512)
def claim_statement(count: int, max_runs: int) -> sql.Statement:
    """The claim of `count` distinct projects for up to max_runs runs, carrying completions or not
    (claims.sql ClaimRuns; the numbers are written into the text), marked to keep its plan. Call it
    before running that variant through claims_sql.claim_runs."""
    st = claims_sql.CLAIM_RUNS.variant(max_runs=max_runs, count=count)
    keep_plan(st.sql)
    return st


# the completion parameters of a claim that carries none (its items are empty)
NO_COMPLETIONS: dict[str, Any] = {"run_ids": [], "attempts": [], "outputs": [], "allowed": [], "worker_projects": None}


# claim statements in a row that may park runs behind full keys before one claims or finds none
MAX_PARKING_ROUNDS = 5


class Claim(NamedTuple):
    """What a claim answers: the runs it claimed, or (replayed) the runs an earlier claim with the
    same claim id claimed that still hold its leases (claim_answers.replay)."""

    rows: Sequence[Row]  # ClaimRuns rows, or ReplayClaimAnswer rows: the same run columns
    replayed: bool = False

    @property
    def taken(self) -> Sequence[Row]:
        """The runs this call claimed (to hand back if they are not delivered): a replay took none."""
        return [] if self.replayed else self.rows


async def claim(
    pool: asyncpg.Pool,
    projects: list[str],
    max_runs: int,
    lease_ttl: float,
    worker_id: str,
    actor: str,
    routing: Routing = NO_ROUTING,
) -> Sequence[Row]:
    """A claim without a claim id: the claimed rows."""
    return (await claim_once(pool, projects, max_runs, lease_ttl, worker_id, actor, routing=routing)).rows


async def claim_once(
    pool: asyncpg.Pool,
    projects: list[str],
    max_runs: int,
    lease_ttl: float,
    worker_id: str,
    actor: str,
    key: ClaimKey | None = None,
    routing: Routing = NO_ROUTING,
) -> Claim:
    """One claim (up to MAX_PARKING_ROUNDS statements while runs get parked); with a claim key,
    the answer recorded for its claim id when there is one. routing: the claiming worker's build
    and labels (workers.Routing)."""
    claim_statement(len(projects), max_runs)
    keyed = key.params() if key is not None else claim_answers.NO_KEY
    for _ in range(MAX_PARKING_ROUNDS):
        try:
            rows = await claims_sql.claim_runs(
                pool,
                count=len(projects),
                max_runs=max_runs,
                projects=projects,
                lease_secs=lease_ttl,
                worker_id=worker_id,
                actor=actor,
                **routing.params(),
                **keyed,
                **NO_COMPLETIONS,
            )
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
    value = await claims_sql.seconds_until_ready(pool, count=len(projects), projects=projects)
    return None if value is None else max(0.0, float(value))


def _taken(result: Claim) -> Sequence[Row]:
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
    routing: Routing = NO_ROUTING,
) -> Claim:
    """Claims up to max_runs (routed by the worker's build and labels); waits up to `wait` seconds for work.
    Answers no runs when the wait ends empty (or the service is stopping, or gone() says the call
    is over: its deadline passed). Cancelled (the call ended), it stops waiting at once and claims
    nothing. With a claim key whose answer is recorded, that answer, at once (even with no runs
    left in it). Long because the wake-ups it owes other waiters are settled on every way out of
    one loop, which reads best whole."""
    deadline = time.monotonic() + wait
    # What this call knows that other waiters may not (a notification wakes one waiter, and
    # only the woken one looks for the earliest retry backoff): it was woken and has not claimed
    # since, or its last wait counted on a backoff ending. It passes that on when it leaves
    # without claiming, however it leaves: the call can end during the claim statement too.
    woken_before = False
    timer = False
    while True:
        with listener.subscribe(projects) as woken:
            try:
                if gone():
                    if woken_before or timer:
                        _pass_on(listener, projects, woken)
                    return Claim([])
                result = await hand_back.to_the_end(
                    pool,
                    lambda: claim_once(pool, projects, max_runs, lease_ttl, worker_id, actor, key, routing),
                    _taken,
                    worker_id,
                    actor,
                )
                if result.replayed:
                    metrics.CLAIM_REPLAYS.inc()
                    if timer:
                        _pass_on(listener, projects, woken)
                    return result
                if result.rows:
                    metrics.count_claims(result.rows)
                    if len(result.rows) >= max_runs or timer:  # a full batch (more may be claimable), or a backoff
                        _pass_on(listener, projects, woken)
                    return result
                left = deadline - time.monotonic()
                if left <= 0 or listener.stopping.is_set():
                    if timer:
                        _pass_on(listener, projects, woken)
                    return result
                timeout, timer = await _wait_timeout(pool, listener, projects, left)
                await _wait(woken, timeout)
            except asyncio.CancelledError:  # the call ended: while it waited, claimed or looked
                if woken_before or woken.is_set() or timer:
                    _pass_on(listener, projects, woken)
                raise
            woken_before = woken.is_set()


async def _wait_timeout(
    pool: asyncpg.Pool, listener: RunReadyListener, projects: list[str], left: float
) -> tuple[float, bool]:
    """How long an empty claim waits to be woken: at most `left`, until the earliest backoff of
    these projects ends, at most the poll interval; and whether it counts on a backoff ending."""
    timeout = left
    next_ready = await seconds_until_ready(pool, projects)
    if next_ready is not None:
        timeout = min(timeout, next_ready + 0.001)
    poll = listener.poll_interval
    if poll is not None:
        timeout = min(timeout, poll)
    return timeout, next_ready is not None


async def _wait(woken: asyncio.Event, timeout: float) -> None:
    """Waits until woken or timeout seconds pass, counted in the claim gauges."""
    metrics.CLAIMS_WAITING.inc()
    try:
        # asyncio.timeout, not wait_for: on 3.11 wait_for returns normally when the
        # event is set in the same turn the call is cancelled, and the cancel is lost
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await woken.wait()
    except asyncio.CancelledError:
        metrics.CLAIMS_ABANDONED.inc()  # (a claim statement's own is counted by to_the_end)
        raise
    finally:
        metrics.CLAIMS_WAITING.dec()


def _pass_on(listener: RunReadyListener, projects: list[str], own: asyncio.Event) -> None:
    """Hands a wake-up on to another waiting claim of these projects (wakeup.py wakes one)."""
    for p in projects:
        listener.wake(p, besides=own, by="passed_on")
