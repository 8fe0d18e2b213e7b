"""A project's flow settings (awooop_project_flow): its retry policy, its claim weight and whether
it is paused (docs/flow-control.md). Each change is one statement that writes its audit row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.common import retry_policy
from services.common.audit import AUDIT_INSERT
from services.common.runs import RUN_READY_CHANNEL

PROJECT_FLOW_SET = "PROJECT_FLOW_SET"  # awooop_audit_log.action
DEFAULT_WEIGHT = 1
MAX_WEIGHT = 1000

GET_SQL = "SELECT retry_policy, weight, paused FROM awooop_project_flow WHERE project_id = $1"
PROJECT_PAUSED = "PROJECT_PAUSED"
PROJECT_RESUMED = "PROJECT_RESUMED"

# $1 project, $2 policy (JSON text), $3 weight, $4 actor
SET_SQL = f"""
WITH upd AS (
    INSERT INTO awooop_project_flow (project_id, retry_policy, weight, updated_by)
    VALUES ($1, $2::text::jsonb, $3, $4)
    ON CONFLICT (project_id) DO UPDATE
       SET retry_policy = EXCLUDED.retry_policy, weight = EXCLUDED.weight,
           updated_by = EXCLUDED.updated_by, updated_at = now()
    RETURNING project_id, retry_policy, weight, paused
),
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, NULL, $4, '{PROJECT_FLOW_SET}', NULL, NULL, NULL,
           jsonb_build_object('retry_policy', retry_policy, 'weight', weight)
      FROM upd
)
SELECT retry_policy, weight, paused FROM upd
"""

# $1 project, $2 paused, $3 actor, $4 reason. Resuming wakes the project's waiting claims.
PAUSE_SQL = f"""
WITH upd AS (
    INSERT INTO awooop_project_flow (project_id, paused, paused_at, updated_by)
    VALUES ($1::text, $2, CASE WHEN $2 THEN now() END, $3)
    ON CONFLICT (project_id) DO UPDATE
       SET paused = EXCLUDED.paused, paused_at = EXCLUDED.paused_at,
           updated_by = EXCLUDED.updated_by, updated_at = now()
    RETURNING project_id, retry_policy, weight, paused
),
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, NULL, $3, CASE WHEN $2 THEN '{PROJECT_PAUSED}' ELSE '{PROJECT_RESUMED}' END,
           NULL, NULL, NULLIF($4, ''), '{{}}'::jsonb
      FROM upd
)
SELECT retry_policy, weight, paused,
       (SELECT pg_notify('{RUN_READY_CHANNEL}', $1::text) WHERE NOT $2) IS NULL AS quiet
  FROM upd
"""


@dataclass(frozen=True)
class ProjectFlow:
    project_id: str
    retry_policy: retry_policy.Policy
    weight: int
    paused: bool = False


def _policy(value: Any) -> retry_policy.Policy:
    if isinstance(value, str):
        value = json.loads(value)
    return dict(value) if isinstance(value, dict) else {}


async def get(pool: asyncpg.Pool, project_id: str) -> ProjectFlow:
    row = await pool.fetchrow(GET_SQL, project_id)
    if row is None:
        return ProjectFlow(project_id, {}, DEFAULT_WEIGHT)
    return ProjectFlow(project_id, _policy(row["retry_policy"]), row["weight"], row["paused"])


async def set_flow(
    pool: asyncpg.Pool, project_id: str, policy: retry_policy.Policy, weight: int, actor: str
) -> ProjectFlow:
    row = await pool.fetchrow(SET_SQL, project_id, json.dumps(policy, sort_keys=True), weight, actor)
    assert row is not None
    return ProjectFlow(project_id, _policy(row["retry_policy"]), row["weight"], row["paused"])


async def set_paused(pool: asyncpg.Pool, project_id: str, paused: bool, actor: str, reason: str) -> ProjectFlow:
    row = await pool.fetchrow(PAUSE_SQL, project_id, paused, actor, reason)
    assert row is not None
    return ProjectFlow(project_id, _policy(row["retry_policy"]), row["weight"], row["paused"])
