"""Generated from idempotency.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "idempotency.sql")
LOCK_SCOPE = Q["LockScope"]
LOOKUP_KEY = Q["LookupKey"]
INSERT_KEY = Q["InsertKey"]


class LookupKeyRow(Protocol):
    """A row of LookupKey."""

    @overload
    def __getitem__(self, key: Literal["request_fingerprint"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["policy_version"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["response_snapshot"], /) -> bytes | None: ...
    @overload
    def __getitem__(self, key: Literal["resource_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["window_start"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["window_end"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def lock_scope(
    db: sql.Queryable, /, *, lock_name: str | None, lock_timeout: str | None, query_timeout: float | None = None
) -> str:
    """LockScope (idempotency.sql).

    Serializes every request of one scope for the rest of the transaction; lock_timeout is the
    caller's remaining deadline ("0": no limit beyond statement_timeout).
    """
    return await db.execute(LOCK_SCOPE.sql, lock_name, lock_timeout, timeout=query_timeout)


async def lookup_key(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    principal_type: str | None,
    principal_id: str | None,
    operation: str | None,
    key: str | None,
    ttl: float | None,
    query_timeout: float | None = None,
) -> LookupKeyRow | None:
    """LookupKey (idempotency.sql).

    One row always: the key's columns (NULL when absent or expired) and the window a new key gets.
    An expired row is deleted here, so the insert after the mutation does not meet it.
    """
    return cast(
        "LookupKeyRow | None",
        await db.fetchrow(
            LOOKUP_KEY.sql, project_id, principal_type, principal_id, operation, key, ttl, timeout=query_timeout
        ),
    )


async def insert_key(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    principal_type: str | None,
    principal_id: str | None,
    operation: str | None,
    key: str | None,
    fingerprint: str | None,
    policy_version: str | None,
    snapshot: bytes | None,
    resource_id: str | None,
    created_at: datetime | None,
    expires_at: datetime | None,
    query_timeout: float | None = None,
) -> str:
    """InsertKey (idempotency.sql).

    The key row of a mutation that just ran, in the same transaction.
    """
    return await db.execute(
        INSERT_KEY.sql,
        project_id,
        principal_type,
        principal_id,
        operation,
        key,
        fingerprint,
        policy_version,
        snapshot,
        resource_id,
        created_at,
        expires_at,
        timeout=query_timeout,
    )
