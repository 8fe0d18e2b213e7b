"""What the reads, gauges, redrive and retention write out in their statements stays one rule:
their status lists are the declared sets (services/common/runstate.py), and every statement that
answers a run answers the same columns. The statements no longer build these pieces from Python at
import, so a change to one copy must show up here as a failure."""

from __future__ import annotations

import re

import asyncpg

from services.common import runstate
from services.common.runstate import TRANSITIONS, Action
from services.common.sql import Statement
from services.ingest import retention_sql, store_sql
from services.scheduler import metrics, overview_sql, queue_sql, reads_sql, redrive_sql

_IN = re.compile(r"\bstatus IN \(([^)]*)\)")


def _status_lists(st: Statement) -> list[set[str]]:
    """Each `status IN (...)` list of the statement, in order."""
    return [{v.strip().strip("'") for v in m.group(1).split(",")} for m in _IN.finditer(st.sql)]


def test_claimable_is_the_claims_own_set() -> None:
    claimable = set(TRANSITIONS[Action.CLAIM].allowed_from)
    assert claimable == set(runstate.CLAIMABLE)
    assert claimable in _status_lists(overview_sql.COUNT_LIVE_RUNS)  # its branch through the claim index
    assert _status_lists(queue_sql.SAMPLE_QUEUE)[0] == claimable
    # its filter: one arm per partial index (claim, approval, leased, parked: migration 0161),
    # together every status that is not finished
    where = queue_sql.SAMPLE_QUEUE.sql[queue_sql.SAMPLE_QUEUE.sql.rindex("WHERE") :]
    arms = [{v.strip().strip("'") for v in m.group(1).split(",")} for m in _IN.finditer(where)]
    arms += [{s} for s in re.findall(r"\bstatus = '([A-Z_]+)'", where)]
    assert set().union(*arms) == set(metrics.UNFINISHED)
    # the gauges count every status that is not finished
    assert set(metrics.UNFINISHED) == set(runstate.STATUSES) - set(runstate.TERMINAL)


def test_redrive_takes_and_gives_the_declared_statuses() -> None:
    t = TRANSITIONS[Action.REDRIVE]
    assert _status_lists(redrive_sql.REDRIVE_RUNS) == [set(t.allowed_from)]
    (to,) = t.to_states
    assert f"SET status = '{to}'" in redrive_sql.REDRIVE_RUNS.sql
    assert f"'{t.audit_for(to)}', from_status, '{to}'" in redrive_sql.REDRIVE_RUNS.sql


def test_retention_takes_finished_runs_only() -> None:
    assert _status_lists(retention_sql.PRUNE_RUNS) == [set(runstate.TERMINAL)]


async def test_every_statement_that_answers_a_run_answers_the_same_columns(db: asyncpg.Connection) -> None:
    """GetRun, ListRuns and CreateRun write the run's column list out (run_to_pb reads
    it by name): the copies must not drift apart. Prepared, not executed."""
    answered = {}
    for st in (reads_sql.GET_RUN, reads_sql.LIST_RUNS, store_sql.CREATE_RUN):
        answered[st.name] = [a.name for a in (await db.prepare(st.sql)).get_attributes()]
    first = answered[reads_sql.GET_RUN.name]
    assert len(set(first)) == len(first)
    # the reads add the attempts used (runs.set_attempts_used) to the run's columns
    assert answered[reads_sql.GET_RUN.name] == answered[reads_sql.LIST_RUNS.name] and "attempts_used" in first
    run_columns = {name: sorted(set(cols) - {"attempts_used"}) for name, cols in answered.items()}
    assert run_columns == {name: sorted(set(first) - {"attempts_used"}) for name in answered}


async def test_a_later_list_page_starts_its_index_scan_at_the_cursor_in_the_generic_plan(
    db: asyncpg.Connection,
) -> None:
    """ListRuns is one statement for the first page and the next ones (the cursor NULL or not);
    its generic plan, the one a prepared statement settles on, still bounds the scan of
    awooop_run_created_list_idx by the cursor rather than reading and filtering every newer run."""
    await db.execute(
        """INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status, created_at)
           SELECT 'p', 'api', 'list-' || g, 'COMPLETED', now() - g * interval '1 s'
             FROM generate_series(1, 5000) AS g"""
    )
    await db.execute("ANALYZE awooop_run_state, awooop_run_created")
    args = ", ".join(
        {"project_id": "'p'", "page_rows": "51", "after_created_at": "now() - interval '1 hour'"}.get(p, "NULL")
        if p != "after_run_id"
        else "'00000000-0000-0000-0000-000000000000'"
        for p in reads_sql.LIST_RUNS.params
    )
    async with db.transaction():
        await db.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await db.execute(f"PREPARE list_page AS {reads_sql.LIST_RUNS.sql}")
        plan = "\n".join(r[0] for r in await db.fetch(f"EXPLAIN EXECUTE list_page({args})"))
        await db.execute("DEALLOCATE list_page")
    # an ordered scan of the index that the page's LIMIT stops, not a bitmap of the project sorted
    assert re.search(r"Index (Only )?Scan using awooop_run_created_list_idx", plan), plan
    cond = next(line for line in plan.splitlines() if "Index Cond" in line)
    assert "created_at <=" in cond, plan


async def test_a_parents_children_page_probes_the_children_index_in_the_generic_plan(
    db: asyncpg.Connection,
) -> None:
    """ListRuns by parent is the same statement: in its generic plan the project's arm is cut by
    a one-time filter and the parent's children are an index range of awooop_run_children_list_idx
    (migration 0201) that starts at the cursor, not a filter over the project's runs."""
    parent = await db.fetchval(
        "INSERT INTO awooop_run_state (project_id, channel_type) VALUES ('p', 'api') RETURNING run_id"
    )
    await db.execute(
        """INSERT INTO awooop_run_state (project_id, channel_type, status, created_at, parent_run_id, parent_step_id,
                                         child_seq)
           SELECT 'p', 'api', 'COMPLETED', now() - g * interval '1 s', $1, 'c' || g, g
             FROM generate_series(1, 2000) AS g""",
        parent,
    )
    await db.execute(
        """INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status, created_at)
           SELECT 'p', 'api', 'list-' || g, 'COMPLETED', now() - g * interval '1 s'
             FROM generate_series(1, 5000) AS g"""
    )
    await db.execute("ANALYZE awooop_run_state, awooop_run_created")
    values = {
        "project_id": "'p'",
        "page_rows": "51",
        "parent_run_id": f"'{parent}'",
        "after_created_at": "now() - interval '10 minutes'",
        "after_run_id": "'00000000-0000-0000-0000-000000000000'",
    }
    args = ", ".join(values.get(p, "NULL") for p in reads_sql.LIST_RUNS.params)
    async with db.transaction():
        await db.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await db.execute(f"PREPARE children_page AS {reads_sql.LIST_RUNS.sql}")
        plan = "\n".join(r[0] for r in await db.fetch(f"EXPLAIN (ANALYZE, COSTS OFF) EXECUTE children_page({args})"))
        await db.execute("DEALLOCATE children_page")
    lines = plan.splitlines()
    probe = next((i for i, line in enumerate(lines) if "awooop_run_children_list_idx" in line), None)
    assert probe is not None, plan
    cond = lines[probe + 1]
    assert "Index Cond" in cond and "parent_run_id =" in cond and "created_at <=" in cond, plan
    # the project's arm is never executed
    assert "One-Time Filter" in plan and re.search(r"awooop_run_created_list_idx.*\(never executed\)", plan), plan


def test_the_two_arms_of_list_runs_filter_alike() -> None:
    """ListRuns writes its filters out once per arm (the project's runs, a parent's children):
    the copies must not drift apart. The project's arm bounds its walk of awooop_run_created rows
    (c) by their creation time, the same value as the run row's."""
    source = reads_sql.LIST_RUNS.source
    arms = source[source.index("FROM ((SELECT") :].split("UNION ALL")
    assert len(arms) == 2

    def filters(arm: str) -> list[str]:
        lines = [line.strip() for line in arm.splitlines()]
        kept = [line for line in lines if line.startswith(("AND (", "AND created_at", "AND c."))]
        return sorted(re.sub(r"\bc\.", "", line) for line in kept)

    first, second = (filters(arm) for arm in arms)
    assert len(first) == 9 and first == second, (first, second)
