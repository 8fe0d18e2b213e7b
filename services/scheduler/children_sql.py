"""Generated from children.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "children.sql")
PARENT_OF_CHILDREN = Q["ParentOfChildren"]
START_CHILD_RUNS = Q["StartChildRuns"]
CHILDREN_OF = Q["ChildrenOf"]


class ParentOfChildrenRow(Protocol):
    """A row of ParentOfChildren."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["child_depth"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["children"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class StartChildRunsRow(Protocol):
    """A row of StartChildRuns."""

    @overload
    def __getitem__(self, key: Literal["ord"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["output"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["failure_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["error_code"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["started"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["leased"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["notified"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["kind"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["completed_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_created"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ChildrenOfRow(Protocol):
    """A row of ChildrenOf."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["parent_step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def parent_of_children(
    db: sql.Queryable,
    /,
    *,
    step_ids: Sequence[str | None] | None,
    run_id: UUID | str | None,
    attempt: int | None,
    projects: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> ParentOfChildrenRow | None:
    """ParentOfChildren (children.sql).

    The caller's parent run under its lease, for the limits StartChildRuns checks before it writes:
    its depth and how many children it has besides those named :step_ids (the fan-out limit counts
    every child it ever started; a parent run again names children it has already).
    """
    return cast(
        "ParentOfChildrenRow | None",
        await db.fetchrow(PARENT_OF_CHILDREN.sql, step_ids, run_id, attempt, projects, timeout=query_timeout),
    )


async def start_child_runs(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    attempt: int | None,
    projects: Sequence[str | None] | None,
    children: str | None,
    policy_defaults: str | None,
    principal_id: str | None,
    traceparent: str | None,
    actor: str | None,
    wait_step_id: str | None,
    timeout: float | None,
    fail_fast: bool | None,
    query_timeout: float | None = None,
) -> list[StartChildRunsRow]:
    """StartChildRuns (children.sql).

    Starts the caller's children (:children, a JSON array in the handler's order: step_id, input,
    priority, not_before, concurrency_keys, max_attempts, required_labels, preferred_labels) in the parent's
    project, each PENDING with
    its RUN_CREATED audit row, the parent's trace context (:traceparent: this RPC's span, else the
    parent's) and depth + 1; a child the parent started before (same step id: a parent run again
    from the top) is found, not started again. With :wait_step_id, the 'children' wait over all of
    them is created in the same statement (or found again): children that exist only from this
    statement on cannot end before their wait exists, and children started earlier are locked
    (FOR SHARE) so that one ending meanwhile either sees the wait or is seen as ended here. The wait
    is created ended when its children have already ended (or, :fail_fast, one of them failed).
    Fenced by the parent's lease (RUNNING at :attempt). Returns one row per child, in order, with
    the wait's columns on each row (NULL without :wait_step_id).
    """
    return cast(
        "list[StartChildRunsRow]",
        await db.fetch(
            START_CHILD_RUNS.sql,
            run_id,
            attempt,
            projects,
            children,
            policy_defaults,
            principal_id,
            traceparent,
            actor,
            wait_step_id,
            timeout,
            fail_fast,
            timeout=query_timeout,
        ),
    )


async def children_of(
    db: sql.Queryable, /, *, run_id: UUID | str | None, limit: int | None, query_timeout: float | None = None
) -> list[ChildrenOfRow]:
    """ChildrenOf (children.sql).

    A run's children in the order they were started (GetRun's run tree; at most :limit).
    """
    return cast("list[ChildrenOfRow]", await db.fetch(CHILDREN_OF.sql, run_id, limit, timeout=query_timeout))
