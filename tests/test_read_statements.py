"""The statuses that the reads, gauges, redrive and retention write out in their statements are the
declared ones (services/common/runstate.py): the statements no longer build their status lists
from runstate at import, so a change to a declared set must show up here as a failure."""

from __future__ import annotations

import re

from services.common import runstate
from services.common.runstate import TRANSITIONS, Action
from services.common.sql import Statement
from services.ingest import retention
from services.scheduler import metrics, overview, queue, redrive

_IN = re.compile(r"\bstatus IN \(([^)]*)\)")


def _status_lists(st: Statement) -> list[set[str]]:
    """Each `status IN (...)` list of the statement, in order."""
    return [{v.strip().strip("'") for v in m.group(1).split(",")} for m in _IN.finditer(st.sql)]


def test_claimable_is_the_claims_own_set() -> None:
    claimable = set(TRANSITIONS[Action.CLAIM].allowed_from)
    assert claimable == set(runstate.CLAIMABLE)
    assert _status_lists(overview.COUNT) == [claimable]
    assert _status_lists(queue.SAMPLE) == [claimable, set(metrics.UNFINISHED)]
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
