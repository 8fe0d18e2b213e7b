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
from services.ingest import retention, store
from services.scheduler import metrics, overview, queue, reads, redrive

_IN = re.compile(r"\bstatus IN \(([^)]*)\)")


def _status_lists(st: Statement) -> list[set[str]]:
    """Each `status IN (...)` list of the statement, in order."""
    return [{v.strip().strip("'") for v in m.group(1).split(",")} for m in _IN.finditer(st.sql)]


def test_claimable_is_the_claims_own_set() -> None:
    claimable = set(TRANSITIONS[Action.CLAIM].allowed_from)
    assert claimable == set(runstate.CLAIMABLE)
    assert _status_lists(overview.COUNT) == [claimable]
    assert _status_lists(queue.SAMPLE)[0] == claimable
    # its filter: one arm per partial index (claim, approval, leased, parked: migration 0161),
    # together every status that is not finished
    where = queue.SAMPLE.sql[queue.SAMPLE.sql.rindex("WHERE") :]
    arms = [{v.strip().strip("'") for v in m.group(1).split(",")} for m in _IN.finditer(where)]
    arms += [{s} for s in re.findall(r"\bstatus = '([A-Z_]+)'", where)]
    assert set().union(*arms) == set(metrics.UNFINISHED)
    # the gauges count every status that is not finished
    assert set(metrics.UNFINISHED) == set(runstate.STATUSES) - set(runstate.TERMINAL)


def test_redrive_takes_and_gives_the_declared_statuses() -> None:
    t = TRANSITIONS[Action.REDRIVE]
    assert _status_lists(redrive.REDRIVE) == [set(t.allowed_from)]
    (to,) = t.to_states
    assert f"SET status = '{to}'" in redrive.REDRIVE.sql
    assert f"'{t.audit_for(to)}', from_status, '{to}'" in redrive.REDRIVE.sql


def test_retention_takes_finished_runs_only() -> None:
    assert _status_lists(retention.PRUNE_RUNS) == [set(runstate.TERMINAL)]


async def test_every_statement_that_answers_a_run_answers_the_same_columns(db: asyncpg.Connection) -> None:
    """GetRun, both ListRuns pages and CreateRun write the run's column list out (run_to_pb reads
    it by name): the copies must not drift apart. Prepared, not executed."""
    answered = {}
    for st in (reads.GET, reads.LIST_FIRST, reads.LIST_AFTER, store.CREATE_RUN):
        answered[st.name] = [a.name for a in (await db.prepare(st.sql)).get_attributes()]
    first = answered[reads.GET.name]
    assert len(set(first)) == len(first)
    assert {name: sorted(cols) for name, cols in answered.items()} == {name: sorted(first) for name in answered}
