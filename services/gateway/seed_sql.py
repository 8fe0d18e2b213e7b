"""Generated from seed.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import cast

from services.common import sql

Q = sql.load(__file__, "seed.sql")
SEED_DEMO = Q["SeedDemo"]


async def seed_demo(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    name: str | None,
    replicas: int | None,
    query_timeout: float | None = None,
) -> str | None:
    """SeedDemo (seed.sql).

    One statement: the demo resource and its deployment row together, as k8s_create_resource makes
    them; nothing when the resource exists. Returns the name when it created them.
    """
    return cast("str | None", await db.fetchval(SEED_DEMO.sql, project_id, name, replicas, timeout=query_timeout))
