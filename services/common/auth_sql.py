"""Generated from auth.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "auth.sql")
LOAD_KEY = Q["LoadKey"]
HAS_ROLE_NOW = Q["HasRoleNow"]


class LoadKeyRow(Protocol):
    """A row of LoadKey."""

    @overload
    def __getitem__(self, key: Literal["secret_sha256"], /) -> bytes: ...
    @overload
    def __getitem__(self, key: Literal["principal_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["principal_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["role"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def load_key(db: sql.Queryable, /, *, key_id: str | None, query_timeout: float | None = None) -> list[LoadKeyRow]:
    """LoadKey (auth.sql).

    A live key's secret hash, its principal and the principal's roles: one row per (project,
    role), or one with NULL project and role when it holds none; no row when the key does not
    exist or is revoked.
    """
    return cast("list[LoadKeyRow]", await db.fetch(LOAD_KEY.sql, key_id, timeout=query_timeout))


async def has_role_now(
    db: sql.Queryable,
    /,
    *,
    principal_id: str | None,
    projects: Sequence[str | None] | None,
    roles: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> bool:
    """HasRoleNow (auth.sql).

    The principal holds one of :roles (the role and those that imply it) in one of :projects (the
    project and '*'), read now (no cache).
    """
    return cast("bool", await db.fetchval(HAS_ROLE_NOW.sql, principal_id, projects, roles, timeout=query_timeout))
