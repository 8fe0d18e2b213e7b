"""Generated from debounce_rules.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "debounce_rules.sql")
SET_DEBOUNCE_RULE = Q["SetDebounceRule"]
LIST_DEBOUNCE_RULES = Q["ListDebounceRules"]
DELETE_DEBOUNCE_RULE = Q["DeleteDebounceRule"]


class SetDebounceRuleRow(Protocol):
    """A row of SetDebounceRule."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["key_expression"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["window_secs"], /) -> float: ...
    @overload
    def __getitem__(self, key: Literal["max_wait_secs"], /) -> float: ...
    @overload
    def __getitem__(self, key: Literal["mode"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["updated_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["updated_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ListDebounceRulesRow(Protocol):
    """A row of ListDebounceRules."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["key_expression"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["window_secs"], /) -> float: ...
    @overload
    def __getitem__(self, key: Literal["max_wait_secs"], /) -> float: ...
    @overload
    def __getitem__(self, key: Literal["mode"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["updated_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["updated_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class DeleteDebounceRuleRow(Protocol):
    """A row of DeleteDebounceRule."""

    @overload
    def __getitem__(self, key: Literal["deleted"], /) -> bool: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def set_debounce_rule(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    channel_type: str | None,
    key_expression: str | None,
    window_secs: float | None,
    max_wait_secs: float | None,
    mode: str | None,
    actor: str | None,
    query_timeout: float | None = None,
) -> SetDebounceRuleRow | None:
    """SetDebounceRule (debounce_rules.sql).

    Creates or replaces the rule of (:project_id, :channel_type). Batches open at the time keep the
    window they were opened with until their next event, which times them by the new rule.
    """
    return cast(
        "SetDebounceRuleRow | None",
        await db.fetchrow(
            SET_DEBOUNCE_RULE.sql,
            project_id,
            channel_type,
            key_expression,
            window_secs,
            max_wait_secs,
            mode,
            actor,
            timeout=query_timeout,
        ),
    )


async def list_debounce_rules(
    db: sql.Queryable, /, *, project_id: str | None, query_timeout: float | None = None
) -> list[ListDebounceRulesRow]:
    """ListDebounceRules (debounce_rules.sql).

    A project's rules, by channel.
    """
    return cast(
        "list[ListDebounceRulesRow]", await db.fetch(LIST_DEBOUNCE_RULES.sql, project_id, timeout=query_timeout)
    )


async def delete_debounce_rule(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    channel_type: str | None,
    actor: str | None,
    query_timeout: float | None = None,
) -> DeleteDebounceRuleRow | None:
    """DeleteDebounceRule (debounce_rules.sql).

    Removes the rule of (:project_id, :channel_type), audited when there was one. Batches already
    open start when their window ends; the channel's later events are runs of their own.
    """
    return cast(
        "DeleteDebounceRuleRow | None",
        await db.fetchrow(DELETE_DEBOUNCE_RULE.sql, project_id, channel_type, actor, timeout=query_timeout),
    )
