"""What `awooop up` puts in the reference gateway so the README's worker (examples/worker.py,
project `demo`) has a deployment to scale: `api` at 1 replica, created once. Left alone when it
exists (a scale a run made, or one an operator made, is kept across restarts)."""

from __future__ import annotations

from services.common.db import Conn

DEMO_PROJECT = "demo"
DEMO_DEPLOYMENT = "api"
DEMO_REPLICAS = 1

# one statement: the resource and its deployment row together, as k8s_create_resource makes them
SEED_DEMO_SQL = """
WITH resource AS (
    INSERT INTO awooop_refgw_resource (project_id, kind, name, spec)
    VALUES ($1, 'Deployment', $2, jsonb_build_object('replicas', $3::int))
    ON CONFLICT DO NOTHING
    RETURNING project_id, name
)
INSERT INTO awooop_refgw_deployment (project_id, name, replicas)
SELECT project_id, name, $3 FROM resource
ON CONFLICT (project_id, name) DO NOTHING
RETURNING name"""


async def seed_demo(conn: Conn) -> bool:
    """Creates the demo deployment unless it exists; True when it was created now."""
    return await conn.fetchval(SEED_DEMO_SQL, DEMO_PROJECT, DEMO_DEPLOYMENT, DEMO_REPLICAS) is not None
