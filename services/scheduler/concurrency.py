"""Concurrency and rate limits per (project, key) (awooop_concurrency_limit; docs/flow-control.md).

The claim statement grants a limited key's free slots and parks what it cannot grant
(claiming.KEY_SLOTS); the trigger of migration 0120 gives a slot back when a run with the key
leaves its lease and wakes the runs parked on it (wait_key). Setting a limit counts the key's leased runs in the
same statement, so a limit set while runs hold leases starts from the truth; removing one wakes
every parked run of the key. Each change writes a CONCURRENCY_LIMIT_SET audit row.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from services.common.audit import AUDIT_INSERT
from services.common.run_options import WAIT_KEY_BUSY, WAIT_RATE_LIMITED
from services.common.runs import RUN_READY_CHANNEL
from services.common.runstate import CLAIMABLE, LEASED, sql_list

CONCURRENCY_LIMIT_SET = "CONCURRENCY_LIMIT_SET"  # awooop_audit_log.action
MAX_LIMIT = 100_000

_PARKED = f"status IN ({sql_list(CLAIMABLE)}) AND not_before = 'infinity'"

# $1 project, $2 key, $3 max_running (NULL: none), $4 actor, $5 max_starts (NULL: none), $6 the
# rate's period in seconds. The key row's lock serializes this with claims of the key; a raised
# limit wakes as many parked runs as it frees.
SET_SQL = f"""
WITH lim AS (
    INSERT INTO awooop_concurrency_limit (project_id, key, max_running, running, updated_by, max_starts, rate_period)
    VALUES ($1::text, $2::text, $3::int, (SELECT count(*) FROM awooop_run_state
                          WHERE project_id = $1 AND $2 = ANY(concurrency_keys) AND status IN ({sql_list(LEASED)})), $4,
            $5::int, CASE WHEN $5::int IS NOT NULL THEN make_interval(secs => $6::float8) END)
    ON CONFLICT (project_id, key) DO UPDATE
       SET max_running = EXCLUDED.max_running, max_starts = EXCLUDED.max_starts,
           rate_period = EXCLUDED.rate_period, updated_by = EXCLUDED.updated_by, updated_at = now()
    RETURNING project_id, key, max_running, running, max_starts,
              extract(epoch FROM rate_period)::float8 AS per
),
woken AS (
    UPDATE awooop_run_state r
       SET not_before = NULL, wait_reason = NULL, wait_key = NULL
     WHERE r.run_id IN (SELECT run_id FROM awooop_run_state
                         WHERE project_id = $1 AND wait_key = $2 AND {_PARKED}
                         ORDER BY priority DESC, created_at
                         LIMIT greatest(0, (SELECT COALESCE(max_running - running, {MAX_LIMIT}) FROM lim))
                           FOR UPDATE SKIP LOCKED)
    RETURNING r.run_id
),
aud AS (
    {AUDIT_INSERT}
    SELECT project_id, NULL, $4, '{CONCURRENCY_LIMIT_SET}', NULL, NULL, NULL,
           jsonb_build_object('key', key, 'max_running', max_running, 'max_starts', max_starts, 'per', per)
      FROM lim
)
SELECT lim.*, (SELECT count(*) FROM woken) AS woken,
       (SELECT pg_notify('{RUN_READY_CHANNEL}', $1::text) WHERE EXISTS (SELECT 1 FROM woken)) IS NULL AS quiet
  FROM lim
"""

# $1 project, $2 key, $3 actor: the key becomes unlimited and its parked runs claimable.
REMOVE_SQL = f"""
WITH gone AS (
    DELETE FROM awooop_concurrency_limit WHERE project_id = $1 AND key = $2 RETURNING project_id, key
),
woken AS (
    UPDATE awooop_run_state
       SET not_before = NULL, wait_reason = NULL, wait_key = NULL
     WHERE project_id = $1 AND wait_key = $2 AND {_PARKED}
    RETURNING run_id
),
aud AS (
    {AUDIT_INSERT}
    VALUES ($1::text, NULL, $3::text, '{CONCURRENCY_LIMIT_SET}', NULL, NULL, NULL,
            jsonb_build_object('key', $2::text, 'max_running', 0))
)
SELECT (SELECT count(*) FROM woken) AS woken,
       (SELECT pg_notify('{RUN_READY_CHANNEL}', $1::text) WHERE EXISTS (SELECT 1 FROM woken)) IS NULL AS quiet
"""

LIST_SQL = f"""
SELECT k.project_id, k.key, k.max_running, k.running, k.max_starts,
       extract(epoch FROM k.rate_period)::float8 AS per,
       (SELECT count(*) FROM awooop_run_state r
         WHERE r.project_id = k.project_id AND r.wait_key = k.key
           AND r.status IN ({sql_list(CLAIMABLE)}) AND r.wait_reason IN ('{WAIT_KEY_BUSY}', '{WAIT_RATE_LIMITED}')
           AND r.not_before > now()) AS waiting
  FROM awooop_concurrency_limit k
 WHERE k.project_id = $1
 ORDER BY k.key
"""


@dataclass(frozen=True)
class Limit:
    project_id: str
    key: str
    max_running: int  # 0: none
    running: int
    waiting: int = 0
    max_starts: int = 0  # 0: none
    per: float = 0.0


def _limit(r: asyncpg.Record, waiting: int = 0) -> Limit:
    return Limit(
        r["project_id"], r["key"], r["max_running"] or 0, r["running"], waiting, r["max_starts"] or 0, r["per"] or 0.0
    )


async def set_limit(
    pool: asyncpg.Pool,
    project_id: str,
    key: str,
    max_running: int,
    actor: str,
    *,
    max_starts: int = 0,
    per: float = 0.0,
) -> Limit:
    """max_running / max_starts 0: no such limit; both 0 removes the key's limits."""
    if max_running == 0 and max_starts == 0:
        await pool.fetchrow(REMOVE_SQL, project_id, key, actor)
        return Limit(project_id, key, 0, 0)
    row = await pool.fetchrow(
        SET_SQL, project_id, key, max_running or None, actor, max_starts or None, per if max_starts else None
    )
    assert row is not None
    return _limit(row)


async def list_limits(pool: asyncpg.Pool, project_id: str) -> list[Limit]:
    rows = await pool.fetch(LIST_SQL, project_id)
    return [_limit(r, r["waiting"]) for r in rows]
