"""Generated from audit.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "audit.sql")
INSERT_AUDIT_ROW = Q["InsertAuditRow"]


async def insert_audit_row(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    run_id: UUID | str | None,
    actor: str | None,
    action: str | None,
    from_status: str | None,
    to_status: str | None,
    reason: str | None,
    details: object,
    query_timeout: float | None = None,
) -> str:
    """InsertAuditRow (audit.sql)."""
    return await db.execute(
        INSERT_AUDIT_ROW.sql,
        project_id,
        run_id,
        actor,
        action,
        from_status,
        to_status,
        reason,
        details,
        timeout=query_timeout,
    )
