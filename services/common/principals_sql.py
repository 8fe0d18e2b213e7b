"""Generated from principals.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "principals.sql")
CREATE_PRINCIPAL = Q["CreatePrincipal"]
ISSUE_KEY = Q["IssueKey"]
REVOKE_KEY = Q["RevokeKey"]
GRANT_ROLE = Q["GrantRole"]
REVOKE_ROLE = Q["RevokeRole"]
LIST_PRINCIPALS = Q["ListPrincipals"]
LIST_KEYS = Q["ListKeys"]
SERVICE_KEY_VALID = Q["ServiceKeyValid"]


class ListPrincipalsRow(Protocol):
    """A row of ListPrincipals."""

    @overload
    def __getitem__(self, key: Literal["principal_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["principal_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["display_name"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["roles"], /) -> list[str]: ...
    @overload
    def __getitem__(self, key: Literal["active_keys"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ListKeysRow(Protocol):
    """A row of ListKeys."""

    @overload
    def __getitem__(self, key: Literal["key_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["principal_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["label"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["revoked_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def create_principal(
    db: sql.Queryable,
    /,
    *,
    principal_id: str | None,
    principal_type: str | None,
    display_name: str | None,
    query_timeout: float | None = None,
) -> str:
    """CreatePrincipal (principals.sql).

    A principal; an existing one keeps its type and gets the new display name.
    """
    return await db.execute(CREATE_PRINCIPAL.sql, principal_id, principal_type, display_name, timeout=query_timeout)


async def issue_key(
    db: sql.Queryable,
    /,
    *,
    key_id: str | None,
    secret_sha256: bytes | None,
    label: str | None,
    principal_id: str | None,
    query_timeout: float | None = None,
) -> str:
    """IssueKey (principals.sql).

    A key for an existing principal (no row inserted: there is no such principal). Only
    sha256(secret) is stored.
    """
    return await db.execute(ISSUE_KEY.sql, key_id, secret_sha256, label, principal_id, timeout=query_timeout)


async def revoke_key(db: sql.Queryable, /, *, key_id: str | None, query_timeout: float | None = None) -> str:
    """RevokeKey (principals.sql)."""
    return await db.execute(REVOKE_KEY.sql, key_id, timeout=query_timeout)


async def grant_role(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    principal_id: str | None,
    role: str | None,
    query_timeout: float | None = None,
) -> str:
    """GrantRole (principals.sql).

    The role in the project ('*': every project); a foreign key violation when the principal does
    not exist.
    """
    return await db.execute(GRANT_ROLE.sql, project_id, principal_id, role, timeout=query_timeout)


async def revoke_role(
    db: sql.Queryable,
    /,
    *,
    principal_id: str | None,
    project_id: str | None,
    role: str | None,
    query_timeout: float | None = None,
) -> str:
    """RevokeRole (principals.sql).

    One role in the project, or every role there when :role is NULL.
    """
    return await db.execute(REVOKE_ROLE.sql, principal_id, project_id, role, timeout=query_timeout)


async def list_principals(db: sql.Queryable, /, *, query_timeout: float | None = None) -> list[ListPrincipalsRow]:
    """ListPrincipals (principals.sql).

    Every principal with its roles ("project:role") and the number of its live keys.
    """
    return cast("list[ListPrincipalsRow]", await db.fetch(LIST_PRINCIPALS.sql, timeout=query_timeout))


async def list_keys(
    db: sql.Queryable, /, *, principal_id: str | None, query_timeout: float | None = None
) -> list[ListKeysRow]:
    """ListKeys (principals.sql).

    Key ids with label and dates (never a secret), newest first; one principal's, or every key
    when :principal_id is NULL.
    """
    return cast("list[ListKeysRow]", await db.fetch(LIST_KEYS.sql, principal_id, timeout=query_timeout))


async def service_key_valid(
    db: sql.Queryable,
    /,
    *,
    key_id: str | None,
    secret_sha256: bytes | None,
    principal_id: str | None,
    role: str | None,
    query_timeout: float | None = None,
) -> bool:
    """ServiceKeyValid (principals.sql).

    The key (:key_id, :secret_sha256) is live, belongs to :principal_id, and that principal still
    holds :role in every project ('*').
    """
    return cast(
        "bool",
        await db.fetchval(SERVICE_KEY_VALID.sql, key_id, secret_sha256, principal_id, role, timeout=query_timeout),
    )
