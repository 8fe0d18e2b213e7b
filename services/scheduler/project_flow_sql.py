"""Generated from project_flow.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "project_flow.sql")
GET_PROJECT_FLOW = Q["GetProjectFlow"]
SET_PROJECT_FLOW = Q["SetProjectFlow"]
PAUSE_PROJECT = Q["PauseProject"]


class GetProjectFlowRow(Protocol):
    """A row of GetProjectFlow."""

    @overload
    def __getitem__(self, key: Literal["retry_policy"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["weight"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["paused"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["versioning"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["sticky_seconds"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class SetProjectFlowRow(Protocol):
    """A row of SetProjectFlow."""

    @overload
    def __getitem__(self, key: Literal["retry_policy"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["weight"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["paused"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["versioning"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["sticky_seconds"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class PauseProjectRow(Protocol):
    """A row of PauseProject."""

    @overload
    def __getitem__(self, key: Literal["retry_policy"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["weight"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["paused"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["versioning"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["sticky_seconds"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["quiet"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def get_project_flow(
    db: sql.Queryable, /, *, project_id: str | None, query_timeout: float | None = None
) -> GetProjectFlowRow | None:
    """GetProjectFlow (project_flow.sql).

    A project's flow settings (no row: the defaults).
    """
    return cast("GetProjectFlowRow | None", await db.fetchrow(GET_PROJECT_FLOW.sql, project_id, timeout=query_timeout))


async def set_project_flow(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    retry_policy: str | None,
    weight: int | None,
    actor: str | None,
    versioning: str | None,
    sticky_seconds: int | None,
    query_timeout: float | None = None,
) -> SetProjectFlowRow | None:
    """SetProjectFlow (project_flow.sql).

    Sets a project's retry policy (:retry_policy, JSON text), claim weight, versioning and sticky
    resume seconds (NULL: keep them; a new project's are pinned and 0), with its PROJECT_FLOW_SET
    audit row.
    """
    return cast(
        "SetProjectFlowRow | None",
        await db.fetchrow(
            SET_PROJECT_FLOW.sql,
            project_id,
            retry_policy,
            weight,
            actor,
            versioning,
            sticky_seconds,
            timeout=query_timeout,
        ),
    )


async def pause_project(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    paused: bool | None,
    actor: str | None,
    reason: str | None,
    query_timeout: float | None = None,
) -> PauseProjectRow | None:
    """PauseProject (project_flow.sql).

    Pauses (:paused true) or resumes a project, with its PROJECT_PAUSED or PROJECT_RESUMED audit
    row. Resuming wakes the project's waiting claims (the NOTIFY is sent at commit).
    """
    return cast(
        "PauseProjectRow | None",
        await db.fetchrow(PAUSE_PROJECT.sql, project_id, paused, actor, reason, timeout=query_timeout),
    )
