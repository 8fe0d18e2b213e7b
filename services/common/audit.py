"""The audit log: one row per state change, written in the transaction of the change."""

from __future__ import annotations

from typing import Any

import asyncpg

from services.common import sql
from services.common.db import Conn

INSERT = sql.load(__file__, "audit.sql")["InsertAuditRow"]


async def audit(
    conn: Conn | asyncpg.Pool,
    *,
    project_id: str,
    run_id: Any,
    actor: str,
    action: str,
    from_status: str | None = None,
    to_status: str | None = None,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    """One audit row. Call it inside the transaction of the change it records."""
    args = INSERT.args(
        project_id=project_id,
        run_id=run_id,
        actor=actor,
        action=action,
        from_status=from_status,
        to_status=to_status,
        reason=reason,
        details=details or {},
    )
    await conn.execute(INSERT.sql, *args)
