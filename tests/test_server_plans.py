"""Server-side plan functions (services/common/server_plans.py) through a real PgBouncer in
transaction mode: the claim cycle's statements run as functions once they exist, answer what
the plain statements answer, survive concurrent creators, and fall back to the plain statement
when a function cannot be created or has gone."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import Any, cast

import asyncpg
import pytest

from services.common import server_plans
from services.common.db import create_pool
from services.common.settings import Settings
from services.scheduler import claim_answers, claiming, leases
from services.scheduler.batch_complete import COMPLETE_MANY
from tests.harness.helpers import eventually
from tests.harness.pgbouncer import PgBouncer, start_pgbouncer
from tests.harness.scheduler import insert_runs

PROJECT = "plans"
CLAIM_STATEMENT = claiming.claim_statement(1, 5)
CLAIM = CLAIM_STATEMENT.sql


def _claim_args(project: str, worker_id: str) -> tuple[object, ...]:
    return CLAIM_STATEMENT.args(
        project=project, lease_secs=30.0, worker_id=worker_id, actor="test", **claim_answers.NO_KEY
    )


@pytest.fixture
def bouncer(db_dsn: str) -> Iterator[PgBouncer]:
    b = start_pgbouncer(db_dsn, pool_size=3)
    try:
        yield b
    finally:
        b.stop()


def _pooled(settings: Settings, bouncer: PgBouncer, db_dsn: str, **changes: Any) -> Settings:
    return settings.with_(
        database_url=bouncer.dsn_for(db_dsn), database_direct_url=db_dsn, db_statement_cache=False, **changes
    )


async def _plans(pool: asyncpg.Pool) -> server_plans.ServerPlans:
    async with pool.acquire() as conn:
        plans = cast(Any, conn).plans  # the pool's ServerPlans (a StoreConnection attribute)
    assert isinstance(plans, server_plans.ServerPlans)
    return plans


async def _function_calls(db: asyncpg.Connection) -> int:
    await db.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        await db.fetchval(
            "SELECT COALESCE(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname LIKE $1",
            server_plans.PREFIX + "%",
        )
    )


async def test_the_claim_cycle_runs_through_its_functions_behind_pgbouncer_and_hands_out_each_run_once(
    db_dsn: str, db: asyncpg.Connection, settings: Settings
) -> None:
    dbname = await db.fetchval("SELECT current_database()")
    await db.execute(f"ALTER DATABASE \"{dbname}\" SET track_functions = 'pl'")  # before PgBouncer connects
    bouncer = start_pgbouncer(db_dsn, pool_size=3)
    pool = await create_pool(_pooled(settings, bouncer, db_dsn, db_pool_max=6))
    try:
        run_ids = set(await insert_runs(db, PROJECT, 60))
        # the first claim (of a project without runs) runs the plain statement and starts
        # creating its function
        await pool.fetch(CLAIM, *_claim_args("nothing-here", "warm-up"))
        plans = await _plans(pool)
        await plans.wait()
        assert plans.ready == 1

        claimed: list[uuid.UUID] = []

        async def worker(w: int) -> None:  # claim -> heartbeat -> complete, concurrently
            for _ in range(20):
                rows = await pool.fetch(CLAIM, *_claim_args(PROJECT, f"w{w}"))
                rows = [r for r in rows if r["run_id"] is not None]
                if not rows:
                    return
                claimed.extend(r["run_id"] for r in rows)
                ids, attempts = [r["run_id"] for r in rows], [r["attempt_count"] for r in rows]
                beat = leases.HEARTBEAT.args(
                    run_ids=ids, attempts=attempts, worker_id=f"w{w}", lease_secs=30.0, worker_projects=None
                )
                renewed = await pool.fetch(leases.HEARTBEAT.sql, *beat)
                assert len(renewed) == len(rows)
                items = COMPLETE_MANY.args(
                    run_ids=ids,
                    attempts=attempts,
                    outputs=["{}"] * len(ids),
                    allowed=["RUNNING"],
                    worker_projects=None,
                    actor="test",
                )
                done = await pool.fetch(COMPLETE_MANY.sql, *items)
                assert all(r["run_id"] is not None for r in done)

        await asyncio.gather(*(worker(w) for w in range(6)))
        await plans.wait()
        assert plans.ready == 3  # claim, heartbeat, completion
    finally:
        await pool.close()
        bouncer.stop()
    assert sorted(map(str, claimed)) == sorted(run_ids)  # every run once, none twice
    rows = await db.fetch("SELECT status, attempt_count FROM awooop_run_state")
    assert {(r["status"], r["attempt_count"]) for r in rows} == {("COMPLETED", 1)}
    assert await db.fetchval("SELECT count(*) FROM pg_proc WHERE proname LIKE $1", server_plans.PREFIX + "%") == 3
    # the calls went to the functions (their statistics arrive when the server connections go idle)
    await eventually(lambda: _function_calls(db), timeout=30, what="calls of the plan functions")


async def test_concurrent_creators_make_one_function_and_agree_on_its_call(db_dsn: str, db: asyncpg.Connection) -> None:
    conns = [await asyncpg.connect(db_dsn, statement_cache_size=0) for _ in range(4)]
    try:
        calls = await asyncio.gather(*(server_plans.ensure(c, CLAIM) for c in conns))
    finally:
        for c in conns:
            await c.close()
    assert len(set(calls)) == 1
    assert await db.fetchval("SELECT count(*) FROM pg_proc WHERE proname LIKE $1", server_plans.PREFIX + "%") == 1


async def test_without_create_privilege_the_statement_stays_plain_and_says_so_once(
    db_dsn: str, db: asyncpg.Connection, settings: Settings, bouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    # the direct URL (where the functions are created) names a role that may not create in the schema
    role = f"plain_{uuid.uuid4().hex[:8]}"
    await db.execute(f"CREATE ROLE {role} LOGIN")
    await db.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    (run_id,) = await insert_runs(db, PROJECT, 1)
    caplog.set_level(logging.WARNING, logger="awooop.db")
    pool = await create_pool(
        _pooled(settings, bouncer, db_dsn).with_(database_direct_url=db_dsn.replace("postgres@", f"{role}@", 1))
    )
    try:
        first = await pool.fetch(CLAIM, *_claim_args(PROJECT, "w"))
        plans = await _plans(pool)
        await plans.wait()
        again = await pool.fetch(CLAIM, *_claim_args("other", "w"))
    finally:
        await pool.close()
        await db.execute(f"DROP ROLE {role}")
    assert [str(r["run_id"]) for r in first] == [run_id]
    assert [r["run_id"] for r in again] == [None]  # nothing claimable: the (parked) count row only
    assert plans.ready == 0
    warnings = [r.getMessage() for r in caplog.records if "server-side plan function" in r.getMessage()]
    assert len(warnings) == 1 and "InsufficientPrivilege" in warnings[0], warnings


async def test_a_dropped_function_falls_back_to_the_plain_statement(
    db_dsn: str, db: asyncpg.Connection, settings: Settings, bouncer: PgBouncer
) -> None:
    pool = await create_pool(_pooled(settings, bouncer, db_dsn))
    try:
        await pool.fetch(CLAIM, *_claim_args(PROJECT, "w"))
        plans = await _plans(pool)
        await plans.wait()
        assert plans.ready == 1
        (name,) = await db.fetchrow("SELECT proname FROM pg_proc WHERE proname LIKE 'awooop_plan_%'")
        await db.execute(f"DROP FUNCTION {name}")
        (run_id,) = await insert_runs(db, PROJECT, 1)
        rows = await pool.fetch(CLAIM, *_claim_args(PROJECT, "w"))  # the call fails; the plain statement runs
        assert [str(r["run_id"]) for r in rows] == [run_id]
        assert plans.ready == 0
    finally:
        await pool.close()
