"""A run's last seq is read as the newest row of its index, whatever the statistics said when the
plan was made (migration 0250). PL/pgSQL keeps a statement's plan until the table's statistics change; a
max(seq) planned on an empty, freshly analyzed awooop_run_event was a sequential scan of the whole
log, or an aggregate over every row of the run, and every later append on that connection read
that much.

The plans are read as Postgres runs them: auto_explain logs every nested statement to this
connection (client_min_messages = log), with the rows each node read, so the test sees the cached
plan itself, not an EXPLAIN of a new one."""

from __future__ import annotations

import re
import uuid

import asyncpg
import pytest

from tests.harness.plans import explain_to_client, logged_plans

pytestmark = pytest.mark.asyncio(loop_scope="session")

APPEND = "SELECT awooop_append_run_event($1, 'p1', 'progress', 'tick', '{}'::jsonb, 1)"
AUDIT = (
    "INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, details)"
    " SELECT 'p1', r, 'test', 'CLAIM', 'PENDING', 'RUNNING', '{\"attempt\": 1}'::jsonb FROM unnest($1::uuid[]) r"
)
# other runs' rows, and a long log for each of the test's runs
GROW = """
INSERT INTO awooop_run_event (run_id, seq, project_id, source, kind, data, attempt)
SELECT gen_random_uuid(), 1, 'p2', 'state', 'CLAIM', '{}'::jsonb, 1 FROM generate_series(1, 20000)
UNION ALL
SELECT r, g, 'p1', 'progress', 'tick', '{}'::jsonb, 1 FROM unnest($1::uuid[]) r, generate_series(100, 2099) g
"""
_READ = re.compile(r"(Seq Scan|Index Only Scan|Index Scan)[^\n]* on awooop_run_event\b[^\n]*rows=(\d+) loops=1")


async def test_last_seq_probes_planned_on_an_empty_log_read_one_row(db: asyncpg.Connection, db_dsn: str) -> None:
    await db.execute("VACUUM ANALYZE awooop_run_event")  # empty, and the statistics say so
    run_id, other = uuid.uuid4(), uuid.uuid4()
    conn = await asyncpg.connect(db_dsn)
    try:
        await explain_to_client(conn, nested=True)
        # plan both probes while the log is empty: past PL/pgSQL's five custom plans
        for _ in range(8):
            await conn.execute(APPEND, run_id)
            await conn.execute(AUDIT, [other])
        await db.execute(GROW, [run_id, other])
        plans = await logged_plans(conn, conn.execute(APPEND, run_id))
        plans += await logged_plans(conn, conn.execute(AUDIT, [other]))
    finally:
        await conn.close()
    probes = [p for p in plans if re.search(r"max\(seq\)|max\(e\.seq\)|ORDER BY e\.seq DESC LIMIT 1", p)]
    assert len(probes) == 2, plans  # the append's probe and the audit trigger's
    for plan in probes:
        reads = _READ.findall(plan)
        assert reads, plan
        assert all(kind == "Index Only Scan" and rows == "1" for kind, rows in reads), plan
    # what they wrote is numbered on from the newest row
    for run in (run_id, other):
        assert await db.fetchval("SELECT max(seq) FROM awooop_run_event WHERE run_id = $1", run) == 2100
