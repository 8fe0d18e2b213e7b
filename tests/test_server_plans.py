"""Server-side plan functions (services/common/server_plans.py): the migration step creates them
from the hot statements' texts, and a pool behind a real PgBouncer in transaction mode only
learns which exist and calls them. The claim cycle through them answers what the plain
statements answer; two releases migrating at once create each function once; a statement
without its function (dropped, never created, not executable) runs plain, logged once; a
function whose result no longer matches its statement (a migration changed a type) is replaced
by the next migration and called again. And StoreConnection's public methods mark a connection
broken on the failures that make it unusable."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import Any, cast

import asyncpg
import pytest

from services.common import db as store
from services.common import migrate, server_plans, server_plans_sql
from services.common.db import create_pool
from services.common.settings import Settings
from services.scheduler import claim_answers, claiming, leases_sql
from services.scheduler.batch_complete import COMPLETE_MANY, NO_CLAIM
from services.scheduler.workers import NO_ROUTING
from tests.harness.helpers import eventually
from tests.harness.pgbouncer import PgBouncer, start_pgbouncer
from tests.harness.scheduler import insert_runs

PROJECT = "plans"
CLAIM_STATEMENT = claiming.claim_statement(1, 5)
CLAIM = CLAIM_STATEMENT.sql
HEARTBEAT_SQL = leases_sql.HEARTBEAT.sql
COMPLETE_MANY_SQL = COMPLETE_MANY.sql


def _claim_args(project: str, worker_id: str) -> tuple[object, ...]:
    return CLAIM_STATEMENT.args(
        projects=[project],
        lease_secs=30.0,
        worker_id=worker_id,
        actor="test",
        **NO_ROUTING.params(),
        **claim_answers.NO_KEY,
        **claiming.NO_COMPLETIONS,
    )


def _beat_args(ids: list[object], attempts: list[int], worker_id: str) -> tuple[object, ...]:
    return leases_sql.HEARTBEAT.args(
        run_ids=ids, attempts=attempts, worker_id=worker_id, lease_secs=30.0, worker_projects=None
    )


COUNT_FUNCTIONS = "SELECT count(*) FROM pg_proc WHERE proname LIKE 'awooop\\_plan\\_%'"


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


async def _function_calls(db: asyncpg.Connection, sql: str | None = None) -> int:
    """Calls of the plan functions (of sql's only, when given) in the statistics."""
    await db.execute("SELECT pg_stat_clear_snapshot()")
    name = server_plans.function_name(sql) if sql else server_plans.PREFIX + "%"
    return int(
        await db.fetchval("SELECT COALESCE(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname LIKE $1", name)
    )


async def _track_functions(db: asyncpg.Connection) -> None:
    """Count function calls in this database (for connections opened from now on)."""
    dbname = await db.fetchval("SELECT current_database()")
    await db.execute(f"ALTER DATABASE \"{dbname}\" SET track_functions = 'pl'")


async def test_the_migration_creates_a_function_for_every_hot_statement_named_by_its_text(
    db: asyncpg.Connection,
) -> None:
    names = {r["name"]: r for r in await server_plans_sql.plan_functions(db)}
    # the statements marked at import, and the per-call variants the worker SDK's claims render
    for sql in (
        HEARTBEAT_SQL,
        COMPLETE_MANY_SQL,
        claiming.claim_statement(1, 1).sql,
        claiming.claim_statement(1, 100).sql,
        claiming.claim_statement(1, 37).sql,
    ):
        assert names[server_plans.function_name(sql)]["callable"]
    # a claim over several projects has none (unless this process rendered one before migrating)
    assert server_plans.function_name(claiming.claim_statement(2, 10).sql) not in names
    # the function's body is the statement's own text
    body = await db.fetchval("SELECT prosrc FROM pg_proc WHERE proname = $1", server_plans.function_name(CLAIM))
    assert CLAIM.strip() in body
    # a migration creates what is missing: every statement marked in this process (tests render
    # more variants than a service has marked when it migrates)
    await migrate.create_plan_functions(db, verify=False)
    hot = migrate.hot_statements()
    names = {r["name"]: r for r in await server_plans_sql.plan_functions(db)}
    assert set(names) == {server_plans.function_name(sql) for sql in hot}
    # then one with nothing to apply changes nothing
    oids = await db.fetch("SELECT oid FROM pg_proc WHERE proname LIKE 'awooop\\_plan\\_%' ORDER BY oid")
    done = await migrate.create_plan_functions(db, verify=False)
    assert (done.created, done.replaced, done.skipped, done.unchanged) == ([], [], [], len(hot))
    # ... nor does one that checks their types against the schema
    done = await migrate.create_plan_functions(db, verify=True)
    assert (done.created, done.replaced, done.skipped, done.unchanged) == ([], [], [], len(hot))
    assert await db.fetch("SELECT oid FROM pg_proc WHERE proname LIKE 'awooop\\_plan\\_%' ORDER BY oid") == oids


async def test_two_releases_migrating_at_once_create_each_function_once(db_dsn: str, db: asyncpg.Connection) -> None:
    await db.execute(
        "DO $$ DECLARE f regprocedure; BEGIN FOR f IN SELECT oid FROM pg_proc WHERE proname LIKE 'awooop\\_plan\\_%' "
        "LOOP EXECUTE 'DROP FUNCTION ' || f; END LOOP; END $$"
    )
    assert await db.fetchval(COUNT_FUNCTIONS) == 0
    # a release whose claim statement differs: its function is another one, beside the current ones
    changed = CLAIM.replace("SELECT it.item", "SELECT  it.item", 1)
    assert changed != CLAIM

    async def other_release() -> server_plans.Created:
        conn = await asyncpg.connect(db_dsn, statement_cache_size=0)
        try:
            await conn.execute("SELECT pg_advisory_lock($1)", migrate.LOCK_KEY)  # as migrate.apply
            try:
                return await server_plans.create_functions(conn, [changed, CLAIM], verify=False)
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", migrate.LOCK_KEY)
        finally:
            await conn.close()

    results = await asyncio.gather(migrate.migrate(db_dsn), migrate.migrate(db_dsn), other_release())
    assert results[:2] == [[], []]  # no migration to apply; the functions were missing
    hot = migrate.hot_statements()
    assert await db.fetchval(COUNT_FUNCTIONS) == len(hot) + 1
    names = [r["proname"] for r in await db.fetch("SELECT proname FROM pg_proc WHERE proname LIKE 'awooop\\_plan\\_%'")]
    assert sorted(names) == sorted({server_plans.function_name(s) for s in [*hot, changed]})


async def test_without_create_privilege_the_migration_step_succeeds_and_says_so_once(
    db: asyncpg.Connection, db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"nocreate_{uuid.uuid4().hex[:8]}"
    await db.execute(f"CREATE ROLE {role} LOGIN")
    await db.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    for sql in (CLAIM, HEARTBEAT_SQL):
        await db.execute(f"DROP FUNCTION {server_plans.function_name(sql)}")
    caplog.set_level(logging.WARNING, logger="awooop.migrate")
    conn = await asyncpg.connect(db_dsn.replace("postgres@", f"{role}@", 1), statement_cache_size=0)
    try:
        done = await migrate.create_plan_functions(conn, verify=False)
    finally:
        await conn.close()
        await db.execute(f"DROP ROLE {role}")
    assert done.created == [] and done.replaced == []
    refused = dict(done.skipped)
    assert {server_plans.function_name(CLAIM), server_plans.function_name(HEARTBEAT_SQL)} <= set(refused)
    assert all("InsufficientPrivilege" in why for why in refused.values()), refused
    warnings = [r.getMessage() for r in caplog.records if "no plan function" in r.getMessage()]
    assert len(warnings) == 1 and "InsufficientPrivilege" in warnings[0], warnings


async def test_the_claim_cycle_runs_through_the_functions_behind_pgbouncer_and_hands_out_each_run_once(
    db_dsn: str, db: asyncpg.Connection, settings: Settings
) -> None:
    await _track_functions(db)  # before PgBouncer connects
    bouncer = start_pgbouncer(db_dsn, pool_size=3)
    before = await db.fetchval(COUNT_FUNCTIONS)
    pool = await create_pool(_pooled(settings, bouncer, db_dsn, db_pool_max=6))
    try:
        plans = await _plans(pool)
        assert plans.ready == before  # learned when the pool opened its first connection
        run_ids = set(await insert_runs(db, PROJECT, 60))
        claimed: list[uuid.UUID] = []

        async def worker(w: int) -> None:  # claim -> heartbeat -> complete, concurrently
            for _ in range(20):
                rows = await pool.fetch(CLAIM, *_claim_args(PROJECT, f"w{w}"))
                rows = [r for r in rows if r["run_id"] is not None]
                if not rows:
                    return
                claimed.extend(r["run_id"] for r in rows)
                ids, attempts = [r["run_id"] for r in rows], [r["attempt_count"] for r in rows]
                renewed = await pool.fetch(HEARTBEAT_SQL, *_beat_args(ids, attempts, f"w{w}"))
                assert len(renewed) == len(rows)
                done = await pool.fetch(
                    COMPLETE_MANY_SQL,
                    *COMPLETE_MANY.args(
                        run_ids=ids,
                        attempts=attempts,
                        outputs=["{}"] * len(ids),
                        allowed=["RUNNING"],
                        worker_projects=None,
                        actor="test",
                        **NO_CLAIM,
                    ),
                )
                # the items' rows, then the claim's (it claims nothing: one row of NULLs)
                assert all(r["run_id"] is not None for r in done[: len(ids)])

        await asyncio.gather(*(worker(w) for w in range(6)))
    finally:
        await pool.close()
        bouncer.stop()
    assert sorted(map(str, claimed)) == sorted(run_ids)  # every run once, none twice
    rows = await db.fetch("SELECT status, attempt_count FROM awooop_run_state")
    assert {(r["status"], r["attempt_count"]) for r in rows} == {("COMPLETED", 1)}
    assert await db.fetchval(COUNT_FUNCTIONS) == before  # the service created none
    # the calls went to each of the three functions (their statistics arrive when the server
    # connections go idle)
    for sql in (CLAIM, HEARTBEAT_SQL, COMPLETE_MANY_SQL):
        await eventually(lambda s=sql: _function_calls(db, s), timeout=30, what="calls of the plan functions")


async def test_without_its_function_a_statement_runs_plain_and_says_so_once(
    db: asyncpg.Connection, settings: Settings, bouncer: PgBouncer, db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    # the migration was not run with this release: its claim statement has no function
    await db.execute(f"DROP FUNCTION {server_plans.function_name(CLAIM)}")
    (run_id,) = await insert_runs(db, PROJECT, 1)
    caplog.set_level(logging.WARNING, logger="awooop.db")
    before = await db.fetchval(COUNT_FUNCTIONS)
    pool = await create_pool(_pooled(settings, bouncer, db_dsn))
    try:
        first = await pool.fetch(CLAIM, *_claim_args(PROJECT, "w"))
        again = await pool.fetch(CLAIM, *_claim_args("other", "w"))
    finally:
        await pool.close()
    assert [str(r["run_id"]) for r in first] == [run_id]
    assert [r["run_id"] for r in again] == [None]  # nothing claimable: the (parked) count row only
    assert await db.fetchval(COUNT_FUNCTIONS) == before  # nothing created at run time
    warnings = [r.getMessage() for r in caplog.records if "no server-side plan function" in r.getMessage()]
    assert len(warnings) == 1 and "awooop migrate" in warnings[0], warnings


async def test_a_role_without_execute_runs_the_statements_plain(
    db: asyncpg.Connection, db_dsn: str, settings: Settings
) -> None:
    role = f"plain_{uuid.uuid4().hex[:8]}"
    await db.execute(f"CREATE ROLE {role} LOGIN")
    try:
        await db.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        await db.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
        await db.execute("REVOKE EXECUTE ON FUNCTION " + server_plans.function_name(CLAIM) + " FROM PUBLIC")
        (run_id,) = await insert_runs(db, PROJECT, 1)
        # the statement cache off without a pooler: the same routing, straight to Postgres
        pool = await create_pool(
            settings.with_(database_url=db_dsn.replace("postgres@", f"{role}@", 1), db_statement_cache=False)
        )
        try:
            plans = await _plans(pool)
            assert plans.call_for(CLAIM, 4) is None  # not learned: the role cannot execute it
            rows = await pool.fetch(CLAIM, *_claim_args(PROJECT, "w"))
            assert [str(r["run_id"]) for r in rows] == [run_id]
            assert plans.call_for(HEARTBEAT_SQL, 5) is not None  # the others are still called
        finally:
            await pool.close()
    finally:
        await db.execute(f"DROP OWNED BY {role}")
        await db.execute(f"DROP ROLE {role}")


async def test_a_dropped_function_falls_back_and_is_called_again_once_the_migration_recreates_it(
    db_dsn: str, db: asyncpg.Connection, settings: Settings, bouncer: PgBouncer
) -> None:
    pool = await create_pool(_pooled(settings, bouncer, db_dsn))
    try:
        plans = await _plans(pool)
        learned = plans.ready
        assert plans.call_for(CLAIM, 4) is not None
        await db.execute(f"DROP FUNCTION {server_plans.function_name(CLAIM)}")
        (run_id,) = await insert_runs(db, PROJECT, 1)
        rows = await pool.fetch(CLAIM, *_claim_args(PROJECT, "w"))  # the call fails; the plain statement runs
        assert [str(r["run_id"]) for r in rows] == [run_id]
        assert plans.call_for(CLAIM, 4) is None
        # the next call outside a transaction learns the functions again: the claim's is gone
        await pool.fetch(CLAIM, *_claim_args(PROJECT, "w"))
        assert plans.ready == learned - 1
        # the next migration creates it again; the pool learns that after the next stale call
        assert server_plans.function_name(CLAIM) in (await migrate.create_plan_functions(db, verify=False)).created
        await db.execute(f"DROP FUNCTION {server_plans.function_name(HEARTBEAT_SQL)}")
        await pool.fetch(HEARTBEAT_SQL, *_beat_args([], [], "w"))  # stale: learn again
        await pool.fetch(HEARTBEAT_SQL, *_beat_args([], [], "w"))
        assert plans.call_for(CLAIM, 4) is not None  # the claim's is back
        assert plans.call_for(HEARTBEAT_SQL, 5) is None  # the heartbeat's is gone
    finally:
        await pool.close()


async def test_a_function_that_no_longer_matches_its_statement_is_replaced_by_the_next_migration(
    db_dsn: str, db: asyncpg.Connection, settings: Settings, bouncer: PgBouncer
) -> None:
    """What a migration that changes a result column's type does to a function created before
    it: its calls fail (the statement's result no longer matches), the statement runs plain,
    and the migration, which checks every function's types after applying migrations, replaces
    it; the pool then calls the new one (and never again the one that failed)."""
    sql = HEARTBEAT_SQL
    name = server_plans.function_name(sql)
    ((params, columns),) = await server_plans.describe(db, [sql])
    assert columns[0] == ("ord", "bigint")
    old = server_plans.definition(sql, params, [("ord", "integer"), *columns[1:]])
    await db.execute(f"DROP FUNCTION {name}; {old}")
    await _track_functions(db)
    (run_id,) = await insert_runs(db, PROJECT, 1)
    pool = await create_pool(_pooled(settings, bouncer, db_dsn))
    try:
        (claimed,) = await pool.fetch(CLAIM, *_claim_args(PROJECT, "w"))
        args = _beat_args([claimed["run_id"]], [1], "w")
        (renewed,) = await pool.fetch(sql, *args)  # the call fails: 42804, the result does not match
        assert renewed["ord"] == 1
        assert await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE heartbeat_at IS NOT NULL") == 1
        done = await migrate.create_plan_functions(db, verify=True)
        assert (done.replaced, done.skipped) == ([name], [])
        (renewed,) = await pool.fetch(sql, *args)  # learned again: the replacement is called
        assert renewed["ord"] == 1
        assert server_plans.call_text(name, 5) == (await _plans(pool)).call_for(sql, 5)
    finally:
        await pool.close()
    assert str(claimed["run_id"]) == run_id
    await eventually(lambda: _function_calls(db, sql), timeout=30, what="a call of the replaced function")


@pytest.mark.parametrize("method", ["execute", "fetch", "fetchrow", "fetchval", "executemany", "fetchmany"])
async def test_each_public_method_marks_the_connection_broken_on_a_poisoning_failure(method: str, db_dsn: str) -> None:
    """A statement refused because the server is read-only (as on a demoted primary) marks the
    connection, whichever public method ran it; the pool's release hook then closes it."""
    conn = await asyncpg.connect(db_dsn, connection_class=store.StoreConnection)
    try:
        await conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        assert not conn.broken
        write = "INSERT INTO awooop_project_flow (project_id) VALUES ($1)"
        call = {
            "execute": lambda: conn.execute(write, "p"),
            "fetch": lambda: conn.fetch(write, "p"),
            "fetchrow": lambda: conn.fetchrow(write, "p"),
            "fetchval": lambda: conn.fetchval(write, "p"),
            "executemany": lambda: conn.executemany(write, [("p",)]),
            "fetchmany": lambda: conn.fetchmany(write + " RETURNING project_id", [("p",)]),
        }[method]
        with pytest.raises(asyncpg.exceptions.ReadOnlySQLTransactionError):
            await call()
        assert conn.broken
    finally:
        await conn.close()
