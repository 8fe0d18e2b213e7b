"""Generated from wakeup.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import cast

from services.common import sql

Q = sql.load(__file__, "wakeup.sql")
PROBE_NOTIFY = Q["ProbeNotify"]
PING = Q["Ping"]


async def probe_notify(
    db: sql.Queryable, /, *, channel: str | None, token: str | None, query_timeout: float | None = None
) -> str:
    """ProbeNotify (wakeup.sql).

    Sent from a second connection after each connect of the LISTEN connection: when it does not
    arrive there (through a transaction-mode pooler the session that listens is not the client's),
    claims poll instead.
    """
    return await db.execute(PROBE_NOTIFY.sql, channel, token, timeout=query_timeout)


async def ping(db: sql.Queryable, /, *, query_timeout: float | None = None) -> int | None:
    """Ping (wakeup.sql).

    Keeps the idle LISTEN connection checked: a dead one fails this and is replaced.
    """
    return cast("int | None", await db.fetchval(PING.sql, timeout=query_timeout))
