"""Child runs (issue 28; docs/architecture.md "Child runs"): a handler starts runs of its own
project and parks until they end.

StartChildRuns is one statement (children.sql): fenced by the parent's lease, it starts the
children a parent has not started yet (a child's identity is (parent, step id), so a parent run
again from the top finds them) and, when asked, creates the 'children' wait over them in the
same transaction. The parent then parks on that wait with AwaitWait, as on any durable wait;
migration 0190's trigger ends the wait in the transaction that ends its last child (or, fail
fast, its first child that did not complete), whatever statement ended it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.common import errors
from services.common.access import check_run_access, projects_with
from services.common.auth import Principal
from services.common.db import Row
from services.common.limits import MAX_CHILD_DEPTH, MAX_CHILDREN_PER_RUN
from services.common.settings import Settings
from services.scheduler import children_sql, metrics, waits_sql
from services.scheduler.refusals import fenced_refusal
from services.scheduler.transitions import WORKER_ROLE

MAX_LISTED = 1000  # children GetRun lists


@dataclass(frozen=True)
class ChildSpec:
    step_id: str
    input: dict[str, Any]
    priority: int = 0
    not_before: dt.datetime | None = None
    concurrency_keys: tuple[str, ...] = ()
    max_attempts: int = 0
    # worker labels as the store's JSON (None: none; services/common/labels.py)
    required_labels_json: str | None = None
    preferred_labels_json: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "step_id": self.step_id,
            "input": self.input,
            "priority": self.priority,
            "not_before": self.not_before.isoformat() if self.not_before else None,
            "concurrency_keys": list(self.concurrency_keys) or None,
            "max_attempts": self.max_attempts,
            "required_labels": json.loads(self.required_labels_json) if self.required_labels_json else None,
            "preferred_labels": json.loads(self.preferred_labels_json) if self.preferred_labels_json else None,
        }


def depth_limit(settings: Settings) -> int:
    return max(1, min(settings.max_child_depth, MAX_CHILD_DEPTH))


def fan_out_limit(settings: Settings) -> int:
    return max(1, min(settings.max_children_per_run, MAX_CHILDREN_PER_RUN))


async def start(
    pool: asyncpg.Pool,
    settings: Settings,
    principal: Principal,
    run_id: str,
    attempt: int,
    children: Sequence[ChildSpec],
    *,
    policy_defaults: str,
    traceparent: str | None,
    wait_step_id: str | None,
    fail_fast: bool,
    timeout: float,
) -> list[Row]:
    """The children in order (started now or found), each row carrying the wait's columns."""
    projects = projects_with(principal, WORKER_ROLE)
    parent = await children_sql.parent_of_children(
        pool, run_id=run_id, attempt=attempt, projects=projects, step_ids=[c.step_id for c in children]
    )
    if parent is None:
        await _refuse(pool, principal, run_id, attempt)
    assert parent is not None
    if parent["child_depth"] + 1 > depth_limit(settings):
        raise errors.child_limit(
            f"run {run_id} is at depth {parent['child_depth']}: its children would pass the depth limit "
            f"{depth_limit(settings)} (AWOOOP_MAX_CHILD_DEPTH)",
            limit=str(depth_limit(settings)),
            depth=str(parent["child_depth"]),
        )
    # a parent run again asks for the same children: they count once
    if parent["children"] + len(children) > fan_out_limit(settings):
        raise errors.child_limit(
            f"run {run_id} has {parent['children']} other children: {len(children)} more would pass the fan-out limit "
            f"{fan_out_limit(settings)} (AWOOOP_MAX_CHILDREN_PER_RUN)",
            limit=str(fan_out_limit(settings)),
            children=str(parent["children"]),
        )
    rows = await children_sql.start_child_runs(
        pool,
        run_id=run_id,
        attempt=attempt,
        projects=projects,
        children=json.dumps([c.as_json() for c in children]),
        policy_defaults=policy_defaults,
        principal_id=principal.principal_id,
        traceparent=traceparent,
        actor=principal.actor,
        wait_step_id=wait_step_id,
        timeout=timeout,
        fail_fast=fail_fast,
    )
    if not rows or not rows[0]["leased"]:
        await _refuse(pool, principal, run_id, attempt)
    if any(r["run_id"] is None for r in rows):
        # the same parent started the same step id in a concurrent call: ask again
        raise errors.store_unavailable("a concurrent StartChildRuns of the same parent, retry")
    started = sum(1 for r in rows if r["started"])
    if started:
        metrics.CHILDREN_STARTED.inc(started)
    return list(rows)


async def _refuse(pool: asyncpg.Pool, principal: Principal, run_id: str, attempt: int) -> None:
    cur = await waits_sql.run_state(pool, run_id=run_id)
    if cur is None:
        raise errors.not_found("run", run_id)
    check_run_access(principal, cur["cur_project"], WORKER_ROLE, run_id)
    raise fenced_refusal(cur, run_id, attempt, "start children of")


async def children_of(pool: asyncpg.Pool, run_id: str) -> list[Row]:
    """A run's children in start order, at most MAX_LISTED + 1 (one more says there are more;
    GetRun; the caller's access to the run is checked)."""
    return list(await children_sql.children_of(pool, run_id=run_id, limit=MAX_LISTED + 1))
