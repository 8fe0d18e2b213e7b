"""What `awooop up` puts in the reference gateway so the README's worker (examples/worker.py,
project `demo`) has a deployment to scale: `api` at 1 replica, created once. Left alone when it
exists (a scale a run made, or one an operator made, is kept across restarts)."""

from __future__ import annotations

from services.common.db import Conn
from services.gateway import seed_sql

DEMO_PROJECT = "demo"
DEMO_DEPLOYMENT = "api"
DEMO_REPLICAS = 1


async def seed_demo(conn: Conn) -> bool:
    """Creates the demo deployment unless it exists; True when it was created now."""
    return (
        await seed_sql.seed_demo(conn, project_id=DEMO_PROJECT, name=DEMO_DEPLOYMENT, replicas=DEMO_REPLICAS)
        is not None
    )
