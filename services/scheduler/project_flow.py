"""A project's flow settings (awooop_project_flow): its retry policy and its claim weight
(docs/flow-control.md). Setting them is one statement that writes the PROJECT_FLOW_SET audit row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.common import retry_policy
from services.common.audit import AUDIT_INSERT

PROJECT_FLOW_SET = "PROJECT_FLOW_SET"  # awooop_audit_log.action
DEFAULT_WEIGHT = 1
MAX_WEIGHT = 1000

GET_SQL = "SELECT retry_policy, weight FROM awooop_project_flow WHERE project_id = $1"

# $1 project, $2 policy (JSON text), $3 weight, $4 actor
SET_SQL = f"""
WITH upd AS (
    INSERT INTO awooop_project_flow (project_id, retry_policy, weight, updated_by)
    VALUES ($1, $2::text::jsonb, $3, $4)
    ON CONFLICT (project_id) DO UPDATE
       SET retry_policy = EXCLUDED.retry_policy, weight = EXCLUDED.weight,
           updated_by = EXCLUDED.updated_by, updated_at = now()
    RETURNING project_id, retry_policy, weight
),
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, NULL, $4, '{PROJECT_FLOW_SET}', NULL, NULL, NULL,
           jsonb_build_object('retry_policy', retry_policy, 'weight', weight)
      FROM upd
)
SELECT retry_policy, weight FROM upd
"""


@dataclass(frozen=True)
class ProjectFlow:
    project_id: str
    retry_policy: retry_policy.Policy
    weight: int


def _policy(value: Any) -> retry_policy.Policy:
    if isinstance(value, str):
        value = json.loads(value)
    return dict(value) if isinstance(value, dict) else {}


async def get(pool: asyncpg.Pool, project_id: str) -> ProjectFlow:
    row = await pool.fetchrow(GET_SQL, project_id)
    if row is None:
        return ProjectFlow(project_id, {}, DEFAULT_WEIGHT)
    return ProjectFlow(project_id, _policy(row["retry_policy"]), row["weight"])


async def set_flow(
    pool: asyncpg.Pool, project_id: str, policy: retry_policy.Policy, weight: int, actor: str
) -> ProjectFlow:
    row = await pool.fetchrow(SET_SQL, project_id, json.dumps(policy, sort_keys=True), weight, actor)
    assert row is not None
    return ProjectFlow(project_id, _policy(row["retry_policy"]), row["weight"])
