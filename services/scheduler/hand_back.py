"""The hand-back (runstate Action.HAND_BACK): runs a claim took but does not deliver go back to
the queue at once, as a ReleaseRun would (the attempt does not count), instead of waiting
RUNNING for a worker that never heard of them until their lease expires. The statement is
claims.sql HandBackUndelivered; this module is the one place that decides when it runs:

- the claim's answer has no room for them (budget.fit_claimed): NO_ROOM, the runs past the
  room; the others are delivered;
- the call is over: it ended (cancelled, deadline passed, connection closed) while its claim
  statement ran (to_the_end), its deadline passed while the runs were claimed, or it was
  cancelled while the runs without room went back (deliver): CALLER_GONE, all of them;
- the call answers an error after its claim committed (a completion's replay read failed,
  batch_complete.complete_and_claim): ANSWER_FAILED, all of them.

A replayed claim (claim_answers.replay) took nothing and hands back nothing: its runs fitted the
first answer and stay with the claim whether this answer arrives or not.

A claim is never interrupted half-way (claiming.py's docstring says why), and neither is a
hand-back: once started it runs to its end even if the call is cancelled again meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import asyncpg

from awooop.scheduler.v1 import scheduler_pb2
from services.common.db import Row, again_on_deadlock
from services.scheduler import budget, claims_sql, metrics

# Why claimed runs were not delivered (the audit reason of their hand-back)
NO_ROOM = "not delivered: the claim's answer had no room left (AWOOOP_MAX_MESSAGE_BYTES)"
ANSWER_FAILED = "not delivered: the claiming call answered an error after the claim committed"
CALLER_GONE = "not delivered: the claiming call ended first (cancelled, deadline passed or connection closed)"

log = logging.getLogger("awooop.scheduler")
T = TypeVar("T")
# hand-backs still running after their handler was cancelled a second time (kept from the GC)
_settling: set[asyncio.Future[None]] = set()


async def hand_back(pool: asyncpg.Pool, rows: Sequence[Row], worker_id: str, actor: str, reason: str) -> int:
    """Hands the claimed rows (run_id, attempt_count, from_status) back in one statement; the
    number handed back (a run cancelled meanwhile is left to the reaper)."""
    if not rows:
        return 0
    # the runs give their keys' slots back in row order: a deadlock aborts the statement whole
    got = await again_on_deadlock(
        lambda: claims_sql.hand_back_undelivered(
            pool,
            run_ids=[r["run_id"] for r in rows],
            attempts=[r["attempt_count"] for r in rows],
            from_statuses=[r["from_status"] for r in rows],
            worker_id=worker_id,
            actor=actor,
            reason=reason,
        )
    )
    return int(got[0]["handed_back"]) if got else 0


async def _give_back(pool: asyncpg.Pool, rows: Sequence[Row], worker_id: str, actor: str, reason: str) -> None:
    try:
        back = await hand_back(pool, rows, worker_id, actor, reason)
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


async def undelivered(
    pool: asyncpg.Pool, rows: Sequence[Row], worker_id: str, actor: str, reason: str = CALLER_GONE
) -> None:
    """Hands back claimed rows whose call will not answer them (cancellation-proof)."""
    if rows:
        await _settle(_give_back(pool, rows, worker_id, actor, reason))


async def _when_done(
    pool: asyncpg.Pool, task: asyncio.Future[T], claimed: Callable[[T], Sequence[Row]], worker_id: str, actor: str
) -> None:
    """Waits for the claim of a call that ended, then hands back what it claimed."""
    try:
        result = await task
    except Exception:  # the statement failed: it claimed nothing
        return
    rows = claimed(result)
    if rows:
        await _give_back(pool, rows, worker_id, actor, CALLER_GONE)


def _cancel_requested() -> bool:
    """The running task (the RPC's handler) was asked to stop: its call is over."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def to_the_end(
    pool: asyncpg.Pool,
    work: Callable[[], Awaitable[T]],
    claimed: Callable[[T], Sequence[Row]],
    worker_id: str,
    actor: str,
) -> T:
    """Runs work() (a statement that claims; claimed(result) are its claimed rows) unless the
    call is already over, and to its end even when the call ends meanwhile: then its runs are
    handed back and the cancellation goes on."""
    if _cancel_requested():
        metrics.CLAIMS_ABANDONED.inc()
        raise asyncio.CancelledError
    task = asyncio.ensure_future(work())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        metrics.CLAIMS_ABANDONED.inc()
        await _settle(_when_done(pool, task, claimed, worker_id, actor))
        raise


async def deliver(
    pool: asyncpg.Pool,
    rows: Sequence[Row],
    answers: Sequence[scheduler_pb2.ClaimedRun],
    *,
    replayed: bool,
    room: int,
    worker_id: str,
    actor: str,
    gone: Callable[[], bool],
) -> int:
    """How many of a claim's answers (rows as ClaimedRun, oldest first) the call delivers; the
    others go back to the queue at once, and all of them when the call is over (see the module's
    docstring)."""
    n = budget.fit_claimed(answers, room)
    if replayed:
        return n
    if rows and gone():
        await undelivered(pool, rows, worker_id, actor)
        return 0
    if n < len(rows):
        overflow = asyncio.ensure_future(hand_back(pool, rows[n:], worker_id, actor, NO_ROOM))
        try:
            back = await asyncio.shield(overflow)  # one statement, never cancelled half-way
        except asyncio.CancelledError:  # the call ended meanwhile: the runs that fit go back too
            await undelivered(pool, rows[:n], worker_id, actor)
            raise
        metrics.CLAIM_HANDED_BACK.inc(back)
    return n
