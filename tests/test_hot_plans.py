"""The claim cycle's statements read runs by their indexes whatever the table's size was when the
plan was made. Postgres plans a prepared statement afresh for its first five calls, then keeps a
generic plan costed on the table as it was then; a service that started on an empty
awooop_run_state (a new install, a new project's first load) kept sequential scans of the whole
table in its claim and heartbeat plans until autovacuum's next analyze of it: 7,400 buffers a claim
at 65,000 runs, three times the Postgres CPU per run. The services price sequential scans out
(services/common/planner.py) and the statements name their runs as `run_id = ANY(ids)`, so a plan
made on an empty table probes the primary key per run; each scan here may read 20 rows.

A project the statistics have not seen (its runs came after the table's last analyze: a new
project on a busy install, every project where autovacuum is off) looked to the planner like a
handful of runs, and a statement that found a run by id and checked the caller's projects read the
project's whole index (awooop_run_list_idx) instead: a heartbeat of ten leases read 28,000 rows
under the bench's dispatch load. The scope checks are not index conditions (`(...) IS TRUE`,
docs/architecture.md "Store"); the second test holds them to the runs they name.

The plans are read as Postgres runs them, on the service pool's own connection
(tests/harness/plans.py)."""

from __future__ import annotations

import re
import uuid

import asyncpg
import pytest

from services.common.db import create_pool
from services.common.runstate import LEASED
from services.common.settings import Settings
from services.saga import journal_sql
from services.scheduler import claim_answers, claiming, claims_sql, leases_sql, run_events_sql
from services.scheduler.transitions import COMPLETE
from services.scheduler.workers import NO_ROUTING
from tests.harness.plans import explain_to_client, logged_plans

pytestmark = pytest.mark.asyncio(loop_scope="session")

WORKER = "w1"
# other projects' runs, queued and leased, the worker's own leased runs and runs it can claim
GROW = """
INSERT INTO awooop_run_state (project_id, channel_type, input, status, worker_id, attempt_count, lease_until)
SELECT 'other', 'api', '{}'::jsonb,
       CASE WHEN g % 2 = 0 THEN 'PENDING' ELSE 'RUNNING' END,
       CASE WHEN g % 2 = 0 THEN NULL ELSE 'w-' || (g % 50) END,
       g % 2, CASE WHEN g % 2 = 0 THEN NULL ELSE now() + interval '1 hour' END
  FROM generate_series(1, 30000) g
UNION ALL
SELECT 'p1', 'api', '{}'::jsonb, 'RUNNING', $1, 1, now() + interval '1 hour' FROM generate_series(1, 10)
UNION ALL
SELECT 'p1', 'api', '{}'::jsonb, 'PENDING', NULL, 0, NULL FROM generate_series(1, 15)
"""
# two older runs behind a key with one slot: the claim takes them first, grants one and parks the
# other (the statement's `parked` update)
KEYED = """
INSERT INTO awooop_concurrency_limit (project_id, key, max_running) VALUES ('p1', 'k', 1);
INSERT INTO awooop_run_state (project_id, channel_type, input, status, attempt_count, concurrency_keys, created_at)
SELECT 'p1', 'api', '{}'::jsonb, 'PENDING', 0, ARRAY['k'], now() - interval '1 hour' FROM generate_series(1, 2);
"""
_SCAN = re.compile(r"(Seq Scan|Index Only Scan|Index Scan|Bitmap Heap Scan)[^\n]* on awooop_run_state\b[^\n]*")
_ROWS = re.compile(r"actual [^)]*rows=(\d+) loops=(\d+)")
_REMOVED = re.compile(r"Rows Removed by (?:Filter|Index Recheck|Join Filter): (\d+)")
_BUFFERS = re.compile(r"Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?")


def _rows_read(plan: str) -> list[tuple[str, int]]:
    """Each scan of awooop_run_state in plan: its line and the rows it read (returned, times its
    loops, plus those its filter removed)."""
    out: list[tuple[str, int]] = []
    lines = plan.splitlines()
    for i, line in enumerate(lines):
        if not _SCAN.search(line):
            continue
        m = _ROWS.search(line)
        read = int(m.group(1)) * int(m.group(2)) if m else 0
        for detail in lines[i + 1 :]:
            if "->" in detail:
                break
            removed = _REMOVED.search(detail)
            if removed and "Join Filter" not in detail:
                read += int(removed.group(1))
        out.append((line.strip(), read))
    return out


def _pages_read(plan: str) -> list[tuple[str, int]]:
    """Each scan of awooop_run_state in plan (logged with buffers) and the pages it read: an index
    condition on a later column of an index filters inside the index, which no row count shows."""
    out: list[tuple[str, int]] = []
    lines = plan.splitlines()
    for i, line in enumerate(lines):
        if _SCAN.search(line):
            for detail in lines[i + 1 :]:
                if "->" in detail:
                    break
                if m := _BUFFERS.search(detail):
                    out.append((line.strip(), sum(int(g or 0) for g in m.groups())))
                    break
    return out


@pytest.mark.parametrize("statement_cache", [True, False], ids=["prepared", "plan-functions"])
async def test_claims_and_heartbeats_planned_on_an_empty_table_read_runs_by_index(
    db: asyncpg.Connection, settings: Settings, statement_cache: bool
) -> None:
    """Prepared statements (a direct connection), and the plan functions a transaction-mode
    pooler's connections call (AWOOOP_DB_STATEMENT_CACHE=false), which keep their plans alike."""
    await db.execute("VACUUM ANALYZE awooop_run_state")  # empty, and the statistics say so
    pool = await create_pool(settings.with_(db_pool_max=1, db_pool_min=1, db_statement_cache=statement_cache))
    claim = claiming.claim_statement(1, 10)
    unknown = [uuid.uuid4() for _ in range(10)]

    def claim_args(run_ids: list[uuid.UUID], attempts: list[int]) -> list[object]:
        return claim.args(
            projects=["p1"], lease_secs=30.0, worker_id=WORKER, actor="test", **claim_answers.NO_KEY,
            **NO_ROUTING.params(),
            run_ids=run_ids, attempts=attempts, outputs=["{}"] * len(run_ids),
            allowed=list(COMPLETE.allowed), worker_projects=None,
        )  # fmt: skip

    def heartbeat_args(run_ids: list[uuid.UUID]) -> list[object]:
        return leases_sql.HEARTBEAT.args(
            run_ids=run_ids, attempts=[1] * len(run_ids), worker_id=WORKER, lease_secs=30.0, worker_projects=None
        )

    try:
        async with pool.acquire() as conn:
            # past the five custom plans of each prepared statement, while the table is empty
            for _ in range(8):
                await conn.fetch(claim.sql, *claim_args(unknown, [1] * 10))
                await conn.fetch(leases_sql.HEARTBEAT.sql, *heartbeat_args(unknown))
            await db.execute(GROW, WORKER)
            await db.execute(KEYED)
            mine = [
                r["run_id"]
                for r in await db.fetch(
                    "SELECT run_id FROM awooop_run_state WHERE project_id = 'p1' AND worker_id = $1", WORKER
                )
            ]
            await explain_to_client(conn, nested=True)
            plans = await logged_plans(conn, conn.fetch(leases_sql.HEARTBEAT.sql, *heartbeat_args(mine)))
            plans += await logged_plans(conn, conn.fetch(claim.sql, *claim_args(mine, [1] * 10)))
    finally:
        await pool.close()
    # the statements' own plans (a plan function's call around one reads no table)
    statements = [plan for plan in plans if _SCAN.search(plan)]
    assert len(statements) == 2, plans
    for plan in statements:
        # the ten runs of the call (each scan's probes), not the 30,000 others
        for scan, read in _rows_read(plan):
            assert "Seq Scan" not in scan and read <= 20, f"{scan} read {read} rows\n{plan}"
    if not statement_cache:  # the statements ran as their functions
        assert any("awooop_plan_" in plan for plan in plans), plans
    # and they did their work: the claim completed the ten runs, parked one keyed run and claimed
    # the other nine it picked
    counts = dict(await db.fetch("SELECT status, count(*) FROM awooop_run_state WHERE project_id = 'p1' GROUP BY 1"))
    assert counts == {"COMPLETED": 10, "RUNNING": 9, "PENDING": 8}, counts
    parked = await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE wait_reason = 'key_busy'")
    assert parked == 1


# runs of another project, analyzed; then the worker's project grows past what the statistics say
OLD = """INSERT INTO awooop_run_state (project_id, channel_type, input, status)
         SELECT 'other', 'api', '{}'::jsonb, 'COMPLETED' FROM generate_series(1, 2000)"""
NEW = """INSERT INTO awooop_run_state (project_id, channel_type, input, status, worker_id, attempt_count, lease_until)
         SELECT 'p1', 'api', '{}'::jsonb, 'COMPLETED', NULL, 1, NULL FROM generate_series(1, 30000)
         UNION ALL
         SELECT 'p1', 'api', '{}'::jsonb, 'RUNNING', $1, 1, now() + interval '1 hour' FROM generate_series(1, 12)"""


@pytest.mark.parametrize("statement_cache", [True, False], ids=["prepared", "plan-functions"])
async def test_scope_checks_of_a_project_newer_than_its_statistics_read_runs_by_id(
    db: asyncpg.Connection, settings: Settings, statement_cache: bool
) -> None:
    """The heartbeat, a progress event (migration 0260's function), a claim carrying completions,
    CompleteRun and the saga's BeginStep, each
    with the caller's projects named (as the servicers call them), in their first (custom)
    plans: every scan of awooop_run_state reads the runs the call names, not the project."""
    await db.execute(OLD)
    await db.execute("ANALYZE awooop_run_state")
    await db.execute(NEW, WORKER)
    mine = [
        r["run_id"]
        for r in await db.fetch("SELECT run_id FROM awooop_run_state WHERE worker_id = $1 ORDER BY run_id", WORKER)
    ]
    ten, one, last = mine[:10], mine[10], mine[11]
    scope = ["p1"]
    claim = claiming.claim_statement(1, 10)
    pool = await create_pool(settings.with_(db_pool_max=1, db_pool_min=1, db_statement_cache=statement_cache))
    try:
        async with pool.acquire() as conn:
            await explain_to_client(conn, nested=True, buffers=True)
            heartbeat = leases_sql.HEARTBEAT.args(
                run_ids=ten, attempts=[1] * 10, worker_id=WORKER, lease_secs=30.0, worker_projects=scope
            )
            begin = journal_sql.begin_step(
                conn, run_id=last, attempt=1, leased=list(LEASED), projects=scope, step_id="s1",
                step_type="tool_call", tool_id="t", tool_params="{}",
            )  # fmt: skip
            complete = COMPLETE.statement.args(
                run_id=one, output="{}", attempt=1, allowed=list(COMPLETE.allowed), worker_projects=scope, actor="test"
            )
            claim_completing = claim.args(
                projects=["nobody"], lease_secs=30.0, worker_id=WORKER, actor="test", **NO_ROUTING.params(),
                **claim_answers.NO_KEY, run_ids=ten, attempts=[1] * 10, outputs=["{}"] * 10,
                allowed=list(COMPLETE.allowed), worker_projects=scope,
            )  # fmt: skip
            emit = run_events_sql.EMIT_RUN_EVENT.args(
                run_id=last, attempt=1, projects=scope, kind="progress", data="{}", emit_key=None,
                max_count=10, max_bytes=10_000,
            )  # fmt: skip
            calls = [
                conn.fetch(leases_sql.HEARTBEAT.sql, *heartbeat),
                conn.fetch(run_events_sql.EMIT_RUN_EVENT.sql, *emit),
                begin,
                conn.fetch(COMPLETE.statement.sql, *complete),
                conn.fetch(claim.sql, *claim_completing),
            ]
            plans = [plan for call in calls for plan in await logged_plans(conn, call)]
    finally:
        await pool.close()
    statements = [plan for plan in plans if _SCAN.search(plan)]
    assert len(statements) >= 5, plans
    for plan in statements:
        for scan, read in _rows_read(plan):
            assert "Seq Scan" not in scan and read <= 20, f"{scan} read {read} rows\n{plan}"
        # the project's part of awooop_run_list_idx is ~250 pages; ten runs' probes ~50
        for scan, pages in _pages_read(plan):
            assert pages <= 100, f"{scan} read {pages} pages\n{plan}"
    # and the calls did their work: eleven runs completed, the twelfth holds its begun step
    counts = dict(await db.fetch("SELECT status, count(*) FROM awooop_run_state WHERE project_id = 'p1' GROUP BY 1"))
    assert counts == {"COMPLETED": 30011, "RUNNING": 1}, counts
    assert await db.fetchval("SELECT count(*) FROM awooop_saga_step WHERE run_id = $1", last) == 1
    progress = "SELECT count(*) FROM awooop_run_event WHERE run_id = $1 AND source = 'progress'"
    assert await db.fetchval(progress, last) == 1


QUEUED = """INSERT INTO awooop_run_state (project_id, channel_type, input, status, not_before)
            SELECT 'p1', 'api', '{}'::jsonb, 'PENDING', 'infinity'::timestamptz FROM generate_series(1, 10000)
            UNION ALL
            SELECT 'p1', 'api', '{}'::jsonb, 'PENDING', NULL FROM generate_series(1, 5000)
            UNION ALL
            SELECT 'p1', 'api', '{}'::jsonb, 'PENDING', now() - interval '1 minute' FROM generate_series(1, 500)
            UNION ALL
            SELECT 'p1', 'api', '{}'::jsonb, 'RESUMED', now() + interval '1 hour' + g * interval '1 second'
              FROM generate_series(1, 5000) g
            UNION ALL
            SELECT 'p2', 'api', '{}'::jsonb, 'PENDING', now() + interval '90 seconds'"""


async def test_the_earliest_backoff_is_found_without_reading_the_queue(
    db: asyncpg.Connection, settings: Settings
) -> None:
    """SecondsUntilReady, asked after every empty long-poll claim, for a project holding 10,000 runs
    parked behind a key, 5,000 queued (a paused project's backlog), 500 due and 5,000 delayed: it
    reads a few index pages (the first delayed run past now()), not the queue, and Postgres keeps
    one plan for it instead of planning each call."""
    await db.execute(QUEUED)
    st = claims_sql.SECONDS_UNTIL_READY.variant(count=1)
    pool = await create_pool(settings.with_(db_pool_max=1, db_pool_min=1))
    try:
        async with pool.acquire() as conn:
            await explain_to_client(conn, buffers=True)
            for _ in range(8):  # a prepared statement's generic plan is weighed from its sixth call
                plans = await logged_plans(conn, conn.fetchval(st.sql, *st.args(projects=["p1"])))
            generic, custom = await conn.fetchrow(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1", st.sql
            )
        one = await claiming.seconds_until_ready(pool, ["p1"])
        both = await claiming.seconds_until_ready(pool, ["p1", "p2"])
        nobody = await claiming.seconds_until_ready(pool, ["p3"])
    finally:
        await pool.close()
    assert one is not None and 3590 < one < 3602, one  # the first delayed run, not a parked or due one
    assert both is not None and 80 < both < 91, both
    assert nobody is None
    assert custom == 5 and generic >= 3, (generic, custom)
    [plan] = plans
    scans = _pages_read(plan)
    assert scans, plan
    for scan, pages in scans:
        assert "awooop_run_delayed_idx" in scan and pages <= 5, f"{scan} read {pages} pages\n{plan}"


NOT_DUE = """INSERT INTO awooop_run_state (project_id, channel_type, input, status, not_before, wait_reason)
             SELECT 'p1', 'api', '{}'::jsonb, 'PENDING', 'infinity'::timestamptz, 'key_busy'
               FROM generate_series(1, 10000)
             UNION ALL
             SELECT 'p1', 'api', '{}'::jsonb, 'PENDING', now() + interval '1 hour' + g * interval '1 second', NULL
               FROM generate_series(1, 5000) g
             UNION ALL
             SELECT 'p1', 'api', '{}'::jsonb, 'PENDING', NULL, NULL FROM generate_series(1, 3)"""


async def test_a_claim_passes_over_runs_not_due_inside_the_index(db: asyncpg.Connection, settings: Settings) -> None:
    """A claim for ten runs of a project with three ready, 10,000 parked behind a busy key and 5,000
    delayed: it takes the three and reads the others' index entries only (the due bound is the
    claim index's expression), not each one's heap row for not_before."""
    await db.execute(NOT_DUE)
    claim = claiming.claim_statement(1, 10)
    args = claim.args(
        projects=["p1"], lease_secs=30.0, worker_id=WORKER, actor="test", **NO_ROUTING.params(), **claim_answers.NO_KEY,
        **claiming.NO_COMPLETIONS,
    )  # fmt: skip
    pool = await create_pool(settings.with_(db_pool_max=1, db_pool_min=1))
    try:
        async with pool.acquire() as conn:
            await explain_to_client(conn, buffers=True)
            plans = await logged_plans(conn, conn.fetch(claim.sql, *args))
    finally:
        await pool.close()
    [plan] = [p for p in plans if _SCAN.search(p)]
    claimed = await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE worker_id = $1", WORKER)
    assert claimed == 3
    scans = [(scan, read) for scan, read in _rows_read(plan) if "awooop_run_claim_idx" in scan]
    assert scans, plan
    for scan, read in scans:
        assert read <= 20, f"{scan} read {read} rows\n{plan}"
