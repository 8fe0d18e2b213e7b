"""Wake-ups of long-polling claims (services/scheduler/wakeup.py): a run-ready notification
wakes one waiting claim, not all of them, and a woken claim that took a full batch passes the
wake-up on, so a notification for more runs than one claim takes still reaches enough waiters.
Real scheduler over a real channel, real Postgres NOTIFY."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest_asyncio
from prometheus_client import REGISTRY

from awooop.scheduler.v1 import scheduler_pb2 as pb
from tests.harness.helpers import eventually
from tests.harness.scheduler import Sched, claims_waiting, dur, insert_runs, make_sched, wait_listening


@pytest_asyncio.fixture(loop_scope="session")
async def s(start_services, channels, db, make_key) -> Sched:
    return await make_sched(start_services, channels, db, make_key)


def wakeups(by: str) -> float:
    return REGISTRY.get_sample_value("awooop_scheduler_claim_wakeups_total", {"by": by}) or 0.0


def abandoned() -> float:
    return REGISTRY.get_sample_value("awooop_scheduler_claims_abandoned_total") or 0.0


def waiting() -> float:
    return REGISTRY.get_sample_value("awooop_scheduler_claims_waiting") or 0.0


async def _waiting_claims(s: Sched, n: int, max_runs: int) -> list[asyncio.Future[list[pb.ClaimedRun]]]:
    await wait_listening(s)
    base = waiting()
    tasks = [asyncio.ensure_future(s.claim(f"w{i}", wait=dur(60), max_runs=max_runs)) for i in range(n)]
    await eventually(lambda: claims_waiting(base + n), what=f"{n} claims to wait")
    return tasks


async def test_one_notification_wakes_one_waiting_claim_not_every_one(s: Sched) -> None:
    tasks = await _waiting_claims(s, 8, max_runs=10)
    notify0, passed0 = wakeups("notify"), wakeups("passed_on")
    try:
        (run_id,) = await insert_runs(s.db, "p", 1)  # one run, one NOTIFY
        done, pending = await asyncio.wait(tasks, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, "a lost wake-up would leave every claim waiting its full 60 s"
        assert [r.run.run_id for r in done.pop().result()] == [run_id]
        # the listener wakes waiters inside the notification's own callback: had it woken every
        # waiter, the counter would already say so. One woken, and a partial batch passes nothing on.
        assert wakeups("notify") - notify0 == 1
        assert wakeups("passed_on") - passed0 == 0
        assert len(pending) == 7 and not any(t.done() for t in pending)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_claim_that_takes_a_full_batch_passes_the_wake_up_on(s: Sched) -> None:
    """Five runs behind one NOTIFY, three waiting claims of two runs each: the woken claim takes
    two and wakes the next, which takes two and wakes the third, which takes the last. Without
    the hand-on, two claims would wait their full 60 s with three runs claimable."""
    tasks = await _waiting_claims(s, 3, max_runs=2)
    passed0 = wakeups("passed_on")
    try:
        ids = await insert_runs(s.db, "p", 5)
        answers = await asyncio.wait_for(asyncio.gather(*tasks), 20)
        got = sorted(r.run.run_id for runs in answers for r in runs)
        assert got == sorted(ids)
        assert sorted(len(runs) for runs in answers) == [1, 2, 2]
        assert wakeups("passed_on") - passed0 == 2
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_notifications_for_several_projects_each_wake_a_claim_of_their_own(s: Sched) -> None:
    """A claim waiting on p and one waiting on q: a run in each, one NOTIFY each, both answer."""
    await wait_listening(s)
    base = waiting()
    on_p = asyncio.ensure_future(s.claim("wp", wait=dur(60), project_ids=["p"]))
    on_q = asyncio.ensure_future(s.claim("wq", wait=dur(60), project_ids=["q"], md=s.outsider))
    try:
        await eventually(lambda: claims_waiting(base + 2), what="two claims to wait")
        (p_run,) = await insert_runs(s.db, "p", 1)
        (q_run,) = await insert_runs(s.db, "q", 1)
        got_p, got_q = await asyncio.wait_for(asyncio.gather(on_p, on_q), 20)
        assert [r.run.run_id for r in got_p] == [p_run]
        assert [r.run.run_id for r in got_q] == [q_run]
    finally:
        for t in (on_p, on_q):
            t.cancel()
        await asyncio.gather(on_p, on_q, return_exceptions=True)


async def test_a_woken_claim_that_leaves_before_a_delayed_run_is_due_hands_it_to_another(s: Sched) -> None:
    """A run due in a moment wakes the longest-waiting claim, which finds nothing claimable yet and
    counts on the backoff's end; its call ends first. The other waiter, never woken by the
    notification, must still get the run when it is due (not at the end of its 60 s wait)."""
    await wait_listening(s)
    base = waiting()
    first = asyncio.ensure_future(s.claim("w-first", wait=dur(60)))
    await eventually(lambda: claims_waiting(base + 1), what="the first claim to wait")
    second = asyncio.ensure_future(s.claim("w-second", wait=dur(60)))
    try:
        await eventually(lambda: claims_waiting(base + 2), what="the second claim to wait")
        notify0 = wakeups("notify")
        run_id = str(
            await s.db.fetchval(
                """INSERT INTO awooop_run_state (project_id, channel_type, input, not_before)
                   VALUES ('p', 'api', '{}', now() + interval '2 seconds') RETURNING run_id"""
            )
        )
        await s.db.execute("SELECT pg_notify('awooop_run_ready', 'p')")

        # the notification wakes the first claim only (the second still waits un-woken), and the
        # first is back waiting on the backoff's timer
        async def woke() -> bool:
            return wakeups("notify") - notify0 >= 1

        await eventually(woke, what="the notification to wake a claim")
        await eventually(lambda: claims_waiting(base + 2), what="the woken claim to wait on its timer")
        first.cancel()  # the first claim's call ends before the run is due
        await asyncio.gather(first, return_exceptions=True)
        runs = await asyncio.wait_for(second, 20)
        assert [r.run.run_id for r in runs] == [run_id]
    finally:
        for t in (first, second):
            t.cancel()
        await asyncio.gather(first, second, return_exceptions=True)


async def test_a_woken_claim_whose_call_ends_during_its_claim_statement_passes_the_wake_up_on(
    s: Sched, db_dsn: str
) -> None:
    """The woken claim's call ends while its claim statement runs (held here by a table lock, so
    the cancel lands there and nowhere else). It claims nothing and leaves, and must still hand
    the wake-up to the other waiter, which never heard the notification."""
    await wait_listening(s)
    base = waiting()
    first = asyncio.ensure_future(s.claim("w-first", wait=dur(60)))
    await eventually(lambda: claims_waiting(base + 1), what="the first claim to wait")
    second = asyncio.ensure_future(s.claim("w-second", wait=dur(60)))
    locker = await asyncpg.connect(db_dsn)
    try:
        await eventually(lambda: claims_waiting(base + 2), what="the second claim to wait")
        run_id = str(
            await s.db.fetchval(
                """INSERT INTO awooop_run_state (project_id, channel_type, input, not_before)
                   VALUES ('p', 'api', '{}', now() + interval '1 second') RETURNING run_id"""
            )
        )
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE awooop_run_state IN ACCESS EXCLUSIVE MODE")
        gave_up0 = abandoned()
        await s.db.execute("SELECT pg_notify('awooop_run_ready', 'p')")

        async def claim_blocked() -> bool:
            return bool(
                await s.db.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'awooop_run_state'::regclass"
                )
            )

        await eventually(claim_blocked, what="the woken claim's statement to wait on the lock")
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)

        async def cancel_arrived() -> bool:
            return abandoned() - gave_up0 >= 1

        await eventually(cancel_arrived, what="the cancel to reach the claim statement")
        await tx.rollback()
        runs = await asyncio.wait_for(second, 20)
        assert [r.run.run_id for r in runs] == [run_id]
    finally:
        await locker.close()
        for t in (first, second):
            t.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
