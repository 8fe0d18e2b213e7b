"""A project's flow settings (awooop_project_flow): its retry policy, its claim weight and whether
it is paused (docs/flow-control.md). Each change is one statement that writes its audit row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.common import retry_policy
from services.scheduler import project_flow_sql

DEFAULT_WEIGHT = 1
MAX_WEIGHT = 1000
MAX_STICKY = 3600  # sticky resume seconds (the CHECK of awooop_project_flow.sticky_seconds)
PINNED, AUTO_UPGRADE = "pinned", "auto_upgrade"  # awooop_project_flow.versioning (its CHECK)
VERSIONING = {False: PINNED, True: AUTO_UPGRADE}  # by auto-upgrade


@dataclass(frozen=True)
class ProjectFlow:
    project_id: str
    retry_policy: retry_policy.Policy
    weight: int
    paused: bool = False
    versioning: str = PINNED  # awooop_project_flow.versioning: pinned or auto_upgrade
    # sticky resume: seconds a run resumed after a wait or an approval waits for the worker that
    # held it (0: off; docs/flow-control.md, "Worker labels and affinity")
    sticky_seconds: int = 0


def _policy(value: Any) -> retry_policy.Policy:
    if isinstance(value, str):
        value = json.loads(value)
    return dict(value) if isinstance(value, dict) else {}


async def get(pool: asyncpg.Pool, project_id: str) -> ProjectFlow:
    row = await project_flow_sql.get_project_flow(pool, project_id=project_id)
    if row is None:
        return ProjectFlow(project_id, {}, DEFAULT_WEIGHT)
    return _flow(project_id, row)


def _flow(project_id: str, row: Any) -> ProjectFlow:
    return ProjectFlow(
        project_id, _policy(row["retry_policy"]), row["weight"], row["paused"], row["versioning"], row["sticky_seconds"]
    )


async def set_flow(
    pool: asyncpg.Pool,
    project_id: str,
    policy: retry_policy.Policy,
    weight: int,
    actor: str,
    versioning: str | None = None,
    sticky_seconds: int | None = None,
) -> ProjectFlow:
    """Sets the project's retry policy and weight, and its versioning and sticky resume seconds
    unless None (kept)."""
    row = await project_flow_sql.set_project_flow(
        pool,
        project_id=project_id,
        retry_policy=json.dumps(policy, sort_keys=True),
        weight=weight,
        actor=actor,
        versioning=versioning,
        sticky_seconds=sticky_seconds,
    )
    assert row is not None
    return _flow(project_id, row)


async def set_paused(pool: asyncpg.Pool, project_id: str, paused: bool, actor: str, reason: str) -> ProjectFlow:
    row = await project_flow_sql.pause_project(pool, project_id=project_id, paused=paused, actor=actor, reason=reason)
    assert row is not None
    return _flow(project_id, row)
