"""Migration 0350 on a store that already has history: a run's audit rows written before it stay
where they were (awooop_audit_entry) and are read once through the view, not twice (their copies
in the run log carry no audit_id); the run's changes after it are its log's state rows, numbered
after the old ones, in the one audit order."""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import pytest

from services.common import migrate
from services.scheduler import run_events_sql
from services.scheduler.run_events import LogRow
from tests.harness.databases import scratch_store
from tests.harness.helpers import eventually, lock_waiters

ONE_HISTORY = 350
COMPACT_STATE_ROWS = 360
P = "p-history"

SEED_RUN_SQL = """
INSERT INTO awooop_run_state (run_id, project_id, channel_type, provider_event_id, status, input)
VALUES ($1, $2, 'api', 'before-0350', 'PENDING', '{}')
"""

# as a statement wrote history before 0350: an INSERT into the audit table, copied into the run
# log by its statement trigger
OLD_HISTORY_SQL = """
INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, details)
VALUES ($1, $2, 'old', 'RUN_CREATED', NULL, 'PENDING', '{"channel_type": "api"}'),
       ($1, $2, 'old', 'CLAIMED', 'PENDING', 'RUNNING', '{"attempt": 1, "worker_id": null}'),
       ($1, NULL, 'old', 'CONCURRENCY_LIMIT_SET', NULL, NULL, '{"key": "k"}')
"""

NEW_HISTORY_SQL = """
SELECT awooop_record_history(ARRAY[
    ROW($1, $2, 'new', 'COMPLETED', 'RUNNING', 'COMPLETED', NULL, '{"attempt": 1, "worker_id": "w"}'),
    ROW($1, NULL, 'new', 'CONCURRENCY_LIMIT_SET', NULL, NULL, NULL, '{"key": "k2"}')
]::awooop_history_row[])
"""


async def test_history_written_before_the_migration_is_read_once_and_continued_after_it(
    pg_server_dsn: str,
) -> None:
    async with scratch_store(pg_server_dsn, below=ONE_HISTORY) as conn:
        run_id = uuid.uuid4()
        await conn.execute(SEED_RUN_SQL, run_id, P)
        await conn.execute(OLD_HISTORY_SQL, P, run_id)
        assert await conn.fetchval("SELECT count(*) FROM awooop_run_event WHERE run_id = $1", run_id) == 2

        applied = await migrate.apply(conn)
        assert applied[0].startswith(f"0{ONE_HISTORY}_")

        rows = await conn.fetch(
            "SELECT action, actor, details FROM awooop_audit_log WHERE run_id = $1 ORDER BY audit_id", run_id
        )
        assert [(r["action"], r["actor"]) for r in rows] == [("RUN_CREATED", "old"), ("CLAIMED", "old")]

        assert await conn.fetchval(NEW_HISTORY_SQL, P, run_id) == 2
        rows = await conn.fetch(
            "SELECT action, actor, from_status, to_status, details FROM awooop_audit_log WHERE run_id = $1"
            " ORDER BY audit_id",
            run_id,
        )
        assert [(r["action"], r["actor"]) for r in rows] == [
            ("RUN_CREATED", "old"),
            ("CLAIMED", "old"),
            ("COMPLETED", "new"),
        ]
        assert (rows[2]["from_status"], rows[2]["to_status"]) == ("RUNNING", "COMPLETED")
        assert rows[2]["details"] == '{"attempt": 1, "worker_id": "w"}'
        # the log goes on where the trigger left it: one offset per row, the new row third
        log = await conn.fetch(
            "SELECT seq, kind, audit_id IS NOT NULL AS audited, attempt FROM awooop_run_event"
            " WHERE run_id = $1 ORDER BY seq",
            run_id,
        )
        assert [(r["seq"], r["kind"], r["audited"]) for r in log] == [
            (1, "RUN_CREATED", False),
            (2, "CLAIMED", False),
            (3, "COMPLETED", True),
        ]
        assert log[2]["attempt"] == 1
        # the rows of no run are entries, in the same audit order
        entries = await conn.fetch(
            "SELECT actor, details FROM awooop_audit_log WHERE run_id IS NULL AND project_id = $1 ORDER BY audit_id", P
        )
        assert [r["actor"] for r in entries] == ["old", "new"]
        assert await conn.fetchval("SELECT count(*) FROM awooop_audit_entry WHERE run_id IS NULL") == 2


async def test_a_state_row_that_meets_a_concurrent_log_row_takes_the_next_seq_with_its_audit_id(
    db: asyncpg.Connection, db_dsn: str
) -> None:
    """The set-based INSERT numbers a run's row after the last committed seq; a step's row being
    written by another transaction takes that seq first. The state row must then go to the next
    free seq, keep its audit_id, and be read through the view once."""
    run_id = uuid.uuid4()
    await db.execute(SEED_RUN_SQL, run_id, P)
    step = await asyncpg.connect(db_dsn)
    history = await asyncpg.connect(db_dsn)
    try:
        tx = step.transaction()
        await tx.start()
        assert await step.fetchval("SELECT awooop_append_run_event($1, $2, 'step', 'pending', '{}', 1)", run_id, P) == 1
        recorded = asyncio.create_task(history.fetchval(NEW_HISTORY_SQL, P, run_id))

        await eventually(lambda: _one_waits(db), what="the history INSERT waiting on the step's seq")
        await tx.commit()
        assert await recorded == 2
    finally:
        await step.close()
        await history.close()
    log = await db.fetch(
        "SELECT seq, source, kind, audit_id IS NOT NULL AS audited FROM awooop_run_event"
        " WHERE run_id = $1 ORDER BY seq",
        run_id,
    )
    assert [tuple(r) for r in log] == [(1, "step", "pending", False), (2, "state", "COMPLETED", True)]
    rows = await db.fetch("SELECT action, actor, from_status FROM awooop_audit_log WHERE run_id = $1", run_id)
    assert [tuple(r) for r in rows] == [("COMPLETED", "new", "RUNNING")]
    # the row of no run, undone with the set's INSERT, is written again once
    entries = await db.fetch(
        "SELECT details->>'key' AS key FROM awooop_audit_log WHERE run_id IS NULL AND project_id = $1", P
    )
    assert [r["key"] for r in entries] == ["k2"]
    # the append wrote the compact form, which WatchRun serves as the JSON of the set's rows
    assert [r.data for r in await _served(db, run_id)][1] == {
        "actor": "new",
        "action": "COMPLETED",
        "details": {"attempt": 1, "worker_id": "w"},
        "to_status": "COMPLETED",
        "from_status": "RUNNING",
    }


async def test_two_appends_that_take_one_seq_write_both_rows_and_a_taken_emit_key_still_fails(
    db: asyncpg.Connection, db_dsn: str
) -> None:
    """Two steps of one run written at once (two FOR SHARE leases do not order them) pick the same
    next seq: the second append waits on the first, then takes the seq after it (migration 0420: a
    plain INSERT whose key violation is caught). A violation of another key (an emit key used
    twice) is not a seq taken: it still fails the call."""
    run_id = uuid.uuid4()
    await db.execute(SEED_RUN_SQL, run_id, P)
    first = await asyncpg.connect(db_dsn)
    second = await asyncpg.connect(db_dsn)
    append = "SELECT awooop_append_run_event($1, $2, 'step', $3, '{}', 1, $4)"
    try:
        tx = first.transaction()
        await tx.start()
        assert await first.fetchval(append, run_id, P, "completed", "e-1") == 1
        racing = asyncio.create_task(second.fetchval(append, run_id, P, "failed", "e-2"))

        await eventually(lambda: _one_waits(db), what="the second append waiting on the first one's seq")
        await tx.commit()
        assert await racing == 2
        with pytest.raises(asyncpg.UniqueViolationError) as raised:
            await second.fetchval(append, run_id, P, "completed", "e-1")
        assert raised.value.constraint_name == "awooop_run_event_emit_key_idx"
    finally:
        await first.close()
        await second.close()
    log = await db.fetch("SELECT seq, kind FROM awooop_run_event WHERE run_id = $1 ORDER BY seq", run_id)
    assert [tuple(r) for r in log] == [(1, "completed"), (2, "failed")]


async def test_a_step_row_reads_as_it_did_before_0430(db: asyncpg.Connection) -> None:
    """Since migration 0430 a step's row leaves its status (the row's kind) and attempt (its
    column) out of its data; WatchRun's reader puts them back. A row written before, with both in
    its data, and one written now through the journal's trigger are served the same object, key
    for key, in jsonb's order."""
    run_id = uuid.uuid4()
    await db.execute(SEED_RUN_SQL, run_id, P)
    before = {"step_id": "s1", "step_type": "tool_call", "status": "failed", "tool_id": "t", "attempt": 2, "error": "x"}
    await db.execute(
        "SELECT awooop_append_run_event($1, $2, 'step', 'failed', $3::jsonb, 2)", run_id, P, json.dumps(before)
    )
    await db.execute(
        """INSERT INTO awooop_saga_step (run_id, step_id, project_id, seq, step_type, tool_id, status, attempt, error)
           VALUES ($1, 's1', $2, 1, 'tool_call', 't', 'failed', 2, 'x')""",
        run_id,
        P,
    )
    stored = await db.fetch("SELECT data::text FROM awooop_run_event WHERE run_id = $1 ORDER BY seq", run_id)
    assert json.loads(stored[1][0]) == {"error": "x", "step_id": "s1", "tool_id": "t", "step_type": "tool_call"}
    old, new = await _served(db, run_id)
    expected = [
        ("error", "x"),
        ("status", "failed"),
        ("attempt", 2),
        ("step_id", "s1"),
        ("tool_id", "t"),
        ("step_type", "tool_call"),
    ]
    assert list(old.data.items()) == expected
    assert list(new.data.items()) == expected


async def _one_waits(db: asyncpg.Connection) -> bool:
    """The racing writer (the one other session of the test's database) waits on a lock."""
    return await lock_waiters(db) == 1


async def _served(conn: asyncpg.Connection, run_id: uuid.UUID) -> list[LogRow]:
    """A run's log as WatchRun serves it: its reader's rows through LogRow, jsonb decoded as the
    services' pool decodes it."""
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    rows = await run_events_sql.run_events_after(conn, run_id=run_id, after=0, max_rows=100)
    return [LogRow.of(r) for r in rows]


# a run's history as each of its readers reads it: WatchRun's stream and the audit view; before
# 0360, WatchRun served the data column as it was
LOG_BEFORE_0360_SQL = "SELECT seq, kind, attempt, data::text FROM awooop_run_event WHERE run_id = $1 ORDER BY seq"
AUDIT_SQL = """
SELECT action, actor, from_status, to_status, reason, details::text FROM awooop_audit_log
 WHERE run_id = $1 ORDER BY audit_id
"""

HISTORY_SQL = """
SELECT awooop_record_history(ARRAY[
    ROW($1, $2, 'svc', 'RUN_CREATED', NULL, 'PENDING', NULL, '{"channel_type": "api", "provider_event_id": "e"}'),
    ROW($1, $2, 'svc', 'CLAIMED', 'PENDING', 'RUNNING', NULL, '{"attempt": 2, "worker_id": "w", "lease": null}'),
    ROW($1, $2, 'op', 'CANCELLED', 'RUNNING', 'CANCELLED', 'operator: stop', '{}')
]::awooop_history_row[])
"""


async def test_state_rows_before_and_after_0360_read_the_same(pg_server_dsn: str) -> None:
    """0360 keeps a state row's statuses, actor and reason in columns and its details alone as
    data. A row written before it keeps its JSON. Both read the same through WatchRun's reader and
    the audit view, and a new row reads exactly as the old form of the same change did."""
    async with scratch_store(pg_server_dsn, below=COMPACT_STATE_ROWS) as conn:
        old_run, new_run = uuid.uuid4(), uuid.uuid4()
        await conn.execute(SEED_RUN_SQL, old_run, P)
        assert await conn.fetchval(HISTORY_SQL, P, old_run) == 3
        log_before = [
            (r["seq"], r["kind"], r["attempt"], json.loads(r["data"]))
            for r in await conn.fetch(LOG_BEFORE_0360_SQL, old_run)
        ]
        audit_before = [tuple(r) for r in await conn.fetch(AUDIT_SQL, old_run)]

        applied = await migrate.apply(conn)
        assert applied[0].startswith(f"0{COMPACT_STATE_ROWS}_")

        assert [(r.offset, r.kind, r.attempt, r.data) for r in await _served(conn, old_run)] == log_before
        assert [tuple(r) for r in await conn.fetch(AUDIT_SQL, old_run)] == audit_before
        await conn.execute(SEED_RUN_SQL, new_run, P)
        assert await conn.fetchval(HISTORY_SQL, P, new_run) == 3
        served = await _served(conn, new_run)
        assert [(r.offset, r.kind, r.attempt, r.data) for r in served] == log_before
        # in the same key order as the JSON of the rows before, which a watcher's client may print
        assert [list(r.data) for r in served] == [list(b[3]) for b in log_before]
        assert [tuple(r) for r in await conn.fetch(AUDIT_SQL, new_run)] == audit_before
        assert log_before[1][2] == 2  # the attempt the details name
        # the point of it: the same change in fewer bytes
        sizes = await conn.fetch(
            "SELECT run_id, sum(pg_column_size(e.*)) AS bytes FROM awooop_run_event e GROUP BY run_id"
        )
        size = {r["run_id"]: r["bytes"] for r in sizes}
        assert size[new_run] < size[old_run] - 3 * 40
        # a state row has its actor, as an audit row always had
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.fetchval(
                "SELECT awooop_record_history(ARRAY[ROW($1, $2, NULL, 'X', NULL, NULL, NULL, '{}')]"
                "::awooop_history_row[])",
                P,
                new_run,
            )
