"""awooop_run_created (migration 0370): the facts a run is created with (project, creation time,
channel, event match key), written once by the statement that creates the run and deleted with
it, so that ListRuns and the event matcher find runs without an index entry on the run row per
update. Whatever writes or deletes runs, and however many at once, the facts are the runs'."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from services.common import migrate, sql
from services.scheduler import reads_sql
from tests.harness.databases import scratch_store

RUN_CREATED = 370
P = "p-created"

INSERT_RUNS_SQL = """
INSERT INTO awooop_run_state (run_id, project_id, channel_type, provider_event_id, status, input, created_at)
SELECT id, $2, ch, 'e-' || id, 'COMPLETED', inp, now() - ord * interval '1 s'
  FROM unnest($1::uuid[], $3::text[], $4::jsonb[]) WITH ORDINALITY AS t(id, ch, inp, ord)
ON CONFLICT (run_id) DO NOTHING
"""

# the facts and the runs, side by side: a fact without its run or a run without its fact shows up
MISMATCH_SQL = """
SELECT count(*) FROM awooop_run_created c FULL JOIN awooop_run_state r ON r.run_id = c.run_id
 WHERE c.run_id IS NULL OR r.run_id IS NULL OR c.project_id <> r.project_id OR c.created_at <> r.created_at
       OR c.channel_type <> r.channel_type
       OR c.match_key IS DISTINCT FROM awooop_event_key(r.channel_type, r.input)
"""

EVENTS = [
    ("telegram", '{"message": {"chat": {"id": 42}, "text": "hi"}}', "42"),
    ("api", '{"correlation_key": "order-7"}', "order-7"),
    ("alertmanager", '{"status": "firing", "groupKey": "g"}', None),  # a firing alert has no key
]


async def _insert(conn: sql.Queryable, ids: list[uuid.UUID], project: str = P) -> str:
    channels = [EVENTS[i % 3][0] for i in range(len(ids))]
    inputs = [EVENTS[i % 3][1] for i in range(len(ids))]
    return str(await conn.execute(INSERT_RUNS_SQL, ids, project, channels, inputs))


async def test_the_facts_of_a_run_are_written_once_and_go_with_it(db: asyncpg.Connection) -> None:
    ids = [uuid.uuid4() for _ in range(3)]
    assert await _insert(db, ids) == "INSERT 0 3"
    rows = await db.fetch("SELECT run_id, channel_type, match_key FROM awooop_run_created WHERE project_id = $1", P)
    assert {(r["run_id"], r["channel_type"], r["match_key"]) for r in rows} == {
        (ids[i], ch, key) for i, (ch, _, key) in enumerate(EVENTS)
    }
    # a statement that inserts some runs and skips others writes the facts of those it inserted
    more = [ids[0], uuid.uuid4()]
    assert await _insert(db, more) == "INSERT 0 1"
    assert await db.fetchval("SELECT count(*) FROM awooop_run_created WHERE project_id = $1", P) == 4
    # a run's updates leave its facts alone, but for an update of the facts themselves (an
    # operator's: no statement of the services makes one); its delete takes them
    await db.execute("UPDATE awooop_run_state SET status = 'FAILED', updated_at = now() WHERE run_id = $1", ids[1])
    await db.execute(
        """UPDATE awooop_run_state SET created_at = now() - interval '3 days', channel_type = 'telegram',
                  input = '{"message": {"chat": {"id": 7}}}' WHERE run_id = $1""",
        more[1],
    )
    assert await db.fetchval("SELECT match_key FROM awooop_run_created WHERE run_id = $1", more[1]) == "7"
    await db.execute("DELETE FROM awooop_run_state WHERE run_id = ANY($1::uuid[])", [ids[0], ids[2]])
    left = await db.fetch("SELECT run_id FROM awooop_run_created WHERE project_id = $1", P)
    assert {r["run_id"] for r in left} == {ids[1], more[1]}
    assert await db.fetchval(MISMATCH_SQL) == 0


async def test_concurrent_writers_and_deleters_of_runs_keep_the_facts_the_runs(
    db: asyncpg.Connection, db_dsn: str
) -> None:
    """Eight connections create runs in batches (some batches overlapping another's runs) while
    two delete runs of the same projects; at the end every run has its facts and nothing else
    does."""
    pool = await asyncpg.create_pool(db_dsn, min_size=10, max_size=10)
    created: list[uuid.UUID] = []
    try:

        async def writer(w: int) -> None:
            for _ in range(10):
                batch = [uuid.uuid4() for _ in range(20)]
                if created:
                    batch[:3] = created[-3:]  # runs another writer already created: skipped
                created.extend(batch[3:])
                async with pool.acquire() as conn:
                    await _insert(conn, batch, f"{P}-{w % 3}")

        async def deleter() -> None:
            for _ in range(20):
                async with pool.acquire() as conn:
                    await conn.execute(
                        """DELETE FROM awooop_run_state WHERE run_id IN (
                               SELECT run_id FROM awooop_run_state WHERE project_id LIKE $1
                                ORDER BY random() LIMIT 7 FOR UPDATE SKIP LOCKED)""",
                        f"{P}-%",
                    )
                await asyncio.sleep(0)

        await asyncio.gather(*(writer(w) for w in range(8)), deleter(), deleter())
    finally:
        await pool.close()
    runs = await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE project_id LIKE $1", f"{P}-%")
    assert 0 < runs < len(created)  # both sides did work
    assert await db.fetchval("SELECT count(*) FROM awooop_run_created WHERE project_id LIKE $1", f"{P}-%") == runs
    assert await db.fetchval(MISMATCH_SQL) == 0


async def test_0370_gives_the_runs_a_store_already_has_their_facts(pg_server_dsn: str) -> None:
    async with scratch_store(pg_server_dsn, below=RUN_CREATED) as conn:
        ids = [uuid.uuid4() for _ in range(6)]
        await _insert(conn, ids)
        applied = await migrate.apply(conn)
        assert applied[0].startswith(f"0{RUN_CREATED}_")
        assert await conn.fetchval(MISMATCH_SQL) == 0
        # ListRuns reads the project's runs through them, newest first (created one second apart)
        args = {p: None for p in reads_sql.LIST_RUNS.params} | {"project_id": P, "page_rows": 4}
        page = await conn.fetch(reads_sql.LIST_RUNS.sql, *reads_sql.LIST_RUNS.args(**args))
        assert [r["run_id"] for r in page] == ids[:4]
        # and the event matcher's key: the Telegram chat and the API correlation key, no firing alert
        keys = await conn.fetch("SELECT match_key FROM awooop_run_created WHERE match_key IS NOT NULL")
        assert sorted(r["match_key"] for r in keys) == ["42", "42", "order-7", "order-7"]
