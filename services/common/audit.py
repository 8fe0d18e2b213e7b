"""The audit log: one row per state change, written in the transaction of the change."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg

from services.common import audit_sql
from services.common.db import Conn


async def audit(
    conn: Conn | asyncpg.Pool,
    *,
    project_id: str,
    run_id: UUID | str,
    actor: str,
    action: str,
    from_status: str | None = None,
    to_status: str | None = None,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    """One audit row. Call it inside the transaction of the change it records."""
    await audit_sql.insert_audit_row(
        conn,
        project_id=project_id,
        run_id=run_id,
        actor=actor,
        action=action,
        from_status=from_status,
        to_status=to_status,
        reason=reason,
        details=details or {},
    )
