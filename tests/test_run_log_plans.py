"""The run log's probes stay index lookups on a connection that planned them while the log was
empty (migration 0250). PL/pgSQL keeps a statement's plan for the connection's life; a plan made
on an empty, freshly analyzed awooop_run_event was a sequential scan, and every later claim and
completion on that connection read the whole log.

The plans are read as Postgres runs them: auto_explain logs every nested statement to this
connection (client_min_messages = log), so the test sees the cached plan itself, not an EXPLAIN
of a new one."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

pytestmark = pytest.mark.asyncio(loop_scope="session")

APPEND = "SELECT awooop_append_run_event($1, 'p1', 'progress', 'tick', '{}'::jsonb, 1)"
AUDIT = (
    "INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, details)"
    " SELECT 'p1', r, 'test', 'CLAIM', 'PENDING', 'RUNNING', '{\"attempt\": 1}'::jsonb FROM unnest($1::uuid[]) r"
)
GROW = (
    "INSERT INTO awooop_run_event (run_id, seq, project_id, source, kind, data, attempt)"
    " SELECT gen_random_uuid(), 1, 'p2', 'state', 'CLAIM', '{}', 1 FROM generate_series(1, 20000)"
)


async def _explained(conn: asyncpg.Connection, sql: str, *args: object) -> list[str]:
    """The plans of every statement `sql` ran, nested ones included."""
    plans: list[str] = []

    def listen(_: asyncpg.Connection, msg: asyncpg.PostgresLogMessage) -> None:
        if "plan:" in str(msg):
            plans.append(str(msg))

    conn.add_log_listener(listen)
    try:
        await conn.execute("SET client_min_messages = log")
        await conn.execute(sql, *args)
        await conn.execute("RESET client_min_messages")
    finally:
        conn.remove_log_listener(listen)
    return plans


async def test_log_probes_planned_on_an_empty_log_stay_index_lookups(db: asyncpg.Connection, db_dsn: str) -> None:
    await db.execute("VACUUM ANALYZE awooop_run_event")  # empty, and the statistics say so
    run_id, other = uuid.uuid4(), uuid.uuid4()
    conn = await asyncpg.connect(db_dsn)
    try:
        await conn.execute("LOAD 'auto_explain'")
        await conn.execute("SET auto_explain.log_min_duration = 0")
        await conn.execute("SET auto_explain.log_nested_statements = on")
        # plan both probes while the log is empty: past PL/pgSQL's five custom plans
        for _ in range(8):
            await conn.execute(APPEND, run_id)
            await conn.execute(AUDIT, [other])
        await db.execute(GROW)
        plans = await _explained(conn, APPEND, run_id) + await _explained(conn, AUDIT, [other])
    finally:
        await conn.close()
    probes = [p for p in plans if "awooop_run_event" in p and "max(" in p]
    assert len(probes) == 2, plans  # the append's probe and the audit trigger's
    for plan in probes:
        assert "Seq Scan on awooop_run_event" not in plan, plan
        assert "awooop_run_event_pkey" in plan, plan
    # what they wrote is numbered on from the rows before, not from an empty log
    assert await db.fetchval("SELECT max(seq) FROM awooop_run_event WHERE run_id = $1", run_id) == 9
    assert await db.fetchval("SELECT max(seq) FROM awooop_run_event WHERE run_id = $1", other) == 9
