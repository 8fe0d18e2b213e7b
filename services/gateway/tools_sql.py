"""Generated from tools.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import cast
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "tools.sql")
LOCK_DEPLOYMENT = Q["LockDeployment"]
SCALE_DEPLOYMENT = Q["ScaleDeployment"]
CREATE_RESOURCE = Q["CreateResource"]
PUT_DEPLOYMENT = Q["PutDeployment"]
DELETE_RESOURCE = Q["DeleteResource"]
DELETE_DEPLOYMENT = Q["DeleteDeployment"]
INSERT_ROW = Q["InsertRow"]
DELETE_ROW = Q["DeleteRow"]
WRITE_KNOWLEDGE = Q["WriteKnowledge"]
DELETE_KNOWLEDGE = Q["DeleteKnowledge"]


async def lock_deployment(
    db: sql.Queryable, /, *, project_id: str | None, name: str | None, query_timeout: float | None = None
) -> int | None:
    """LockDeployment (tools.sql).

    A deployment's replicas, locked until the scaling transaction ends.
    """
    return cast("int | None", await db.fetchval(LOCK_DEPLOYMENT.sql, project_id, name, timeout=query_timeout))


async def scale_deployment(
    db: sql.Queryable,
    /,
    *,
    replicas: int | None,
    project_id: str | None,
    name: str | None,
    query_timeout: float | None = None,
) -> str:
    """ScaleDeployment (tools.sql)."""
    return await db.execute(SCALE_DEPLOYMENT.sql, replicas, project_id, name, timeout=query_timeout)


async def create_resource(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    kind: str | None,
    name: str | None,
    spec: object,
    query_timeout: float | None = None,
) -> bool | None:
    """CreateResource (tools.sql).

    A resource; no row when one of that kind and name exists.
    """
    return cast(
        "bool | None", await db.fetchval(CREATE_RESOURCE.sql, project_id, kind, name, spec, timeout=query_timeout)
    )


async def put_deployment(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    name: str | None,
    replicas: int | None,
    query_timeout: float | None = None,
) -> str:
    """PutDeployment (tools.sql).

    The deployment row of a Deployment resource (replaced when one was left behind).
    """
    return await db.execute(PUT_DEPLOYMENT.sql, project_id, name, replicas, timeout=query_timeout)


async def delete_resource(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    kind: str | None,
    name: str | None,
    query_timeout: float | None = None,
) -> bool | None:
    """DeleteResource (tools.sql).

    true when it existed.
    """
    return cast("bool | None", await db.fetchval(DELETE_RESOURCE.sql, project_id, kind, name, timeout=query_timeout))


async def delete_deployment(
    db: sql.Queryable, /, *, project_id: str | None, name: str | None, query_timeout: float | None = None
) -> str:
    """DeleteDeployment (tools.sql)."""
    return await db.execute(DELETE_DEPLOYMENT.sql, project_id, name, timeout=query_timeout)


async def insert_row(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    table_name: str | None,
    data: object,
    query_timeout: float | None = None,
) -> UUID | None:
    """InsertRow (tools.sql)."""
    return cast("UUID | None", await db.fetchval(INSERT_ROW.sql, project_id, table_name, data, timeout=query_timeout))


async def delete_row(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    table_name: str | None,
    row_id: UUID | str | None,
    query_timeout: float | None = None,
) -> bool | None:
    """DeleteRow (tools.sql).

    true when it existed.
    """
    return cast("bool | None", await db.fetchval(DELETE_ROW.sql, project_id, table_name, row_id, timeout=query_timeout))


async def write_knowledge(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    entry_id: str | None,
    content: object,
    query_timeout: float | None = None,
) -> bool | None:
    """WriteKnowledge (tools.sql).

    An entry, created or replaced; true when created (xmax = 0: the row is a fresh insert).
    """
    return cast(
        "bool | None", await db.fetchval(WRITE_KNOWLEDGE.sql, project_id, entry_id, content, timeout=query_timeout)
    )


async def delete_knowledge(
    db: sql.Queryable, /, *, project_id: str | None, entry_id: str | None, query_timeout: float | None = None
) -> bool | None:
    """DeleteKnowledge (tools.sql).

    true when it existed.
    """
    return cast("bool | None", await db.fetchval(DELETE_KNOWLEDGE.sql, project_id, entry_id, timeout=query_timeout))
