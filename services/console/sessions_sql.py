"""Generated from sessions.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "sessions.sql")
CREATE_SESSION = Q["CreateSession"]
TOUCH_SESSION = Q["TouchSession"]
REVOKE_SESSION = Q["RevokeSession"]
PRUNE_SESSIONS = Q["PruneSessions"]


class TouchSessionRow(Protocol):
    """A row of TouchSession."""

    @overload
    def __getitem__(self, key: Literal["key_ciphertext"], /) -> bytes: ...
    @overload
    def __getitem__(self, key: Literal["key_nonce"], /) -> bytes: ...
    @overload
    def __getitem__(self, key: Literal["key_label"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def create_session(
    db: sql.Queryable,
    /,
    *,
    session_hash: bytes | None,
    key_ciphertext: bytes | None,
    key_nonce: bytes | None,
    key_label: str | None,
    ttl: float | None,
    query_timeout: float | None = None,
) -> datetime:
    """CreateSession (sessions.sql).

    A session for :ttl seconds; the token's digest and the API key encrypted under it.
    """
    return cast(
        "datetime",
        await db.fetchval(
            CREATE_SESSION.sql, session_hash, key_ciphertext, key_nonce, key_label, ttl, timeout=query_timeout
        ),
    )


async def touch_session(
    db: sql.Queryable, /, *, session_hash: bytes | None, query_timeout: float | None = None
) -> TouchSessionRow | None:
    """TouchSession (sessions.sql).

    A live session, touched in the same statement that reads it.
    """
    return cast("TouchSessionRow | None", await db.fetchrow(TOUCH_SESSION.sql, session_hash, timeout=query_timeout))


async def revoke_session(
    db: sql.Queryable, /, *, session_hash: bytes | None, query_timeout: float | None = None
) -> str:
    """RevokeSession (sessions.sql)."""
    return await db.execute(REVOKE_SESSION.sql, session_hash, timeout=query_timeout)


async def prune_sessions(db: sql.Queryable, /, *, batch: int | None, query_timeout: float | None = None) -> str:
    """PruneSessions (sessions.sql).

    One batch of sessions that ended (expired or signed out) more than a day ago.
    """
    return await db.execute(PRUNE_SESSIONS.sql, batch, timeout=query_timeout)
