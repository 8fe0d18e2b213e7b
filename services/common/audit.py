"""The audit log: one row per state change, written in the transaction of the change."""

from __future__ import annotations

from typing import Any

import asyncpg

from services.common.db import Conn

# The audit row's columns, in the order every INSERT of the project writes them (an
# `AUDIT_INSERT SELECT ...` or `VALUES` lists exactly these).
AUDIT_INSERT = (
    "INSERT INTO awooop_audit_log (project_id, run_id, actor, action, from_status, to_status, reason, details)"
)

AUDIT_SQL = f"{AUDIT_INSERT} VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"


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
    await conn.execute(AUDIT_SQL, project_id, run_id, actor, action, from_status, to_status, reason, details or {})
