"""The run row's column order (migration 0380): what a run is created with first, what its
transitions change last, so that an update kept on its page logs the changed columns and not the
run's input. The rebuild keeps every row, and everything on the table, as it was."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from typing import Any

import asyncpg

from awooop.scheduler.v1 import scheduler_pb2 as pb
from services.common import migrate
from tests.harness.databases import scratch_store
from tests.harness.scheduler import Sched, lease, make_sched

ROW_ORDER = 380

# the same definitions before and after the rebuild, each by name: the table's constraints, the
# foreign keys that point at it, its indexes, its triggers, the views over it, its storage options
DEFINITIONS_SQL = """
SELECT 'constraint ' || c.conname || ' on ' || c.conrelid::regclass, pg_get_constraintdef(c.oid)
  FROM pg_constraint c
 WHERE c.conrelid = 'awooop_run_state'::regclass OR c.confrelid = 'awooop_run_state'::regclass
UNION ALL
SELECT 'index ' || i.indexrelid::regclass, pg_get_indexdef(i.indexrelid)
  FROM pg_index i WHERE i.indrelid = 'awooop_run_state'::regclass
UNION ALL
SELECT 'trigger ' || t.tgname, pg_get_triggerdef(t.oid)
  FROM pg_trigger t WHERE t.tgrelid = 'awooop_run_state'::regclass AND NOT t.tgisinternal
UNION ALL
SELECT 'view ' || v.viewname, v.definition
  FROM pg_views v WHERE v.viewname IN ('awooop_run_cur', 'awooop_run_saga_steps')
UNION ALL
SELECT 'options', array_to_string(c.reloptions, ',')
  FROM pg_class c WHERE c.oid = 'awooop_run_state'::regclass
UNION ALL
SELECT 'grants on ' || c.relname, array_to_string(c.relacl, ',')
  FROM pg_class c WHERE c.relname IN ('awooop_run_state', 'awooop_run_cur', 'awooop_run_saga_steps')
"""

ROWS_SQL = "SELECT run_id, to_jsonb(r) AS row FROM awooop_run_state r ORDER BY run_id"

SEED_PARENT_SQL = """
INSERT INTO awooop_run_state (run_id, project_id, channel_type, provider_event_id, status, input, worker_id,
                              attempt_count, lease_until, heartbeat_at, concurrency_keys, priority, traceparent)
VALUES ($1, 'p-order', 'telegram', 'e-1', 'RUNNING', '{"message": {"chat": {"id": 7}, "text": "hi"}}', 'w1', 1,
        now() + interval '30 s', now(), ARRAY['k1', 'k2'], 5,
        '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')
"""
SEED_CHILD_SQL = """
INSERT INTO awooop_run_state (run_id, project_id, channel_type, status, input, parent_run_id, parent_step_id,
                              child_seq, child_depth, output, saga_status, approval_summary, failure_reason)
VALUES ($1, 'p-order', 'api', 'COMPLETED', '{"n": 2}', $2, 'fan-out', 1, 1, '{"ok": true}', 'not_needed',
        'ship it?', NULL)
"""
SEED_STEP_SQL = """
INSERT INTO awooop_saga_step (run_id, step_id, project_id, seq, step_type, status, attempt)
VALUES ($1, 's1', 'p-order', 1, 'llm_call', 'completed', 1)
"""


def _definitions(rows: list[asyncpg.Record]) -> dict[str, str]:
    return {r[0]: r[1] for r in rows}


async def test_the_rebuild_keeps_every_row_and_everything_on_the_table(pg_server_dsn: str) -> None:
    async with scratch_store(pg_server_dsn, below=ROW_ORDER) as conn:
        # an operator's grants (a reporting role, PUBLIC) are carried over with the table
        reader = f"awooop_reader_{uuid.uuid4().hex[:8]}"
        await conn.execute(f"CREATE ROLE {reader}")
        try:
            await _rebuild_and_check(conn, reader)
        finally:  # a role is the server's, not the scratch database's
            await conn.execute(f"DROP OWNED BY {reader}")
            await conn.execute(f"DROP ROLE {reader}")


async def _rebuild_and_check(conn: asyncpg.Connection, reader: str) -> None:
    parent, child = uuid.uuid4(), uuid.uuid4()
    await conn.execute(SEED_PARENT_SQL, parent)
    await conn.execute(SEED_CHILD_SQL, child, parent)
    await conn.execute(SEED_STEP_SQL, parent)
    await conn.execute(f"GRANT SELECT ON awooop_run_state TO {reader} WITH GRANT OPTION")
    await conn.execute(f"GRANT SELECT ON awooop_run_cur, awooop_run_saga_steps TO {reader}, PUBLIC")
    before_defs = _definitions(await conn.fetch(DEFINITIONS_SQL))
    before_rows = [dict(r) for r in await conn.fetch(ROWS_SQL)]
    facts = await conn.fetchval("SELECT count(*) FROM awooop_run_created")

    # 0380 alone (later migrations add columns of their own, last)
    (rebuild,) = [m for m in migrate.load() if m.version == ROW_ORDER]
    async with conn.transaction():
        await conn.execute(rebuild.sql)

    assert _definitions(await conn.fetch(DEFINITIONS_SQL)) == before_defs
    assert reader in before_defs["grants on awooop_run_state"]
    assert [dict(r) for r in await conn.fetch(ROWS_SQL)] == before_rows
    assert await conn.fetchval("SELECT count(*) FROM awooop_run_created") == facts == 2
    columns = await conn.fetch(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'awooop_run_state'::regclass AND attnum > 0"
        " AND NOT attisdropped ORDER BY attnum"
    )
    assert [c["attname"] for c in columns][-3:] == ["lease_until", "heartbeat_at", "updated_at"]

    # what is on the table works on the new one: the statement trigger writes a new run's
    # facts, the foreign keys cascade and set null, the views read it
    third = uuid.uuid4()
    await conn.execute(
        "INSERT INTO awooop_run_state (run_id, project_id, channel_type, input) VALUES ($1, 'p-order', 'api', '{}')",
        third,
    )
    assert await conn.fetchval("SELECT count(*) FROM awooop_run_created WHERE run_id = $1", third) == 1
    await conn.execute("DELETE FROM awooop_run_state WHERE run_id = $1", parent)
    assert await conn.fetchval("SELECT count(*) FROM awooop_saga_step WHERE run_id = $1", parent) == 0
    assert await conn.fetchval("SELECT parent_run_id FROM awooop_run_state WHERE run_id = $1", child) is None
    assert await conn.fetchval("SELECT count(*) FROM awooop_run_created") == 2
    assert await conn.fetchval("SELECT cur_status FROM awooop_run_cur WHERE cur_run_id = $1", child) == "COMPLETED"


# --- what a transition logs ------------------------------------------------------------------------

SMALL, LARGE = '{"n": 1}', '{"text": "' + "x" * 1500 + '"}'  # both stored inline (under TOAST's 2 KB)


async def _wal_of(s: Sched, call: Awaitable[Any]) -> int:
    before = await s.db.fetchval("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
    await call
    return int(await s.db.fetchval("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn") - before)


async def _transitions(s: Sched, project: str, payload: str) -> tuple[int, int, int]:
    """WAL bytes of one run's claim, heartbeat and completion, through the scheduler's RPCs."""
    await s.db.execute(
        "INSERT INTO awooop_run_state (project_id, channel_type, input) VALUES ($1, 'api', $2::jsonb)", project, payload
    )
    claimed: list[pb.ClaimedRun] = []

    async def claim() -> None:
        claimed.extend(await s.claim("w-order", project_ids=[project], max_runs=1))

    claim_wal = await _wal_of(s, claim())
    (run,) = claimed
    token = lease(run.lease.run_id, run.lease.attempt)
    heartbeat_wal = await _wal_of(s, s.heartbeat("w-order", token))
    complete_wal = await _wal_of(s, s.stub.CompleteRun(pb.CompleteRunRequest(lease=token), metadata=s.worker))
    return claim_wal, heartbeat_wal, complete_wal


async def test_a_transition_logs_what_it_changes_not_the_input(start_services, channels, db, make_key) -> None:
    """A claim, a heartbeat and a completion of a run whose input is 1.5 KB log about what those of
    a run with an input of a few bytes log (before migration 0380, the claim and the completion
    each logged the input again). Bytes, not time: the least of three runs of each, so a write of
    another session into the same WAL cannot make it fail."""
    s = await make_sched(start_services, channels, db, make_key)
    small = [await _transitions(s, "p", SMALL) for _ in range(3)]
    large = [await _transitions(s, "p", LARGE) for _ in range(3)]
    for i, what in enumerate(("claim", "heartbeat", "completion")):
        least_small, least_large = min(t[i] for t in small), min(t[i] for t in large)
        assert least_large - least_small < 200, (what, least_small, least_large)
