"""Generated from wait_callbacks.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "wait_callbacks.sql")
COMPLETE_WAIT_BY_TOKEN = Q["CompleteWaitByToken"]


class CompleteWaitByTokenRow(Protocol):
    """A row of CompleteWaitByToken."""

    @overload
    def __getitem__(self, key: Literal["outcome"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["run_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["resumed"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["completed_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["kind"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def complete_wait_by_token(
    db: sql.Queryable,
    /,
    *,
    result: object,
    actor: str | None,
    token_hash: bytes | None,
    query_timeout: float | None = None,
) -> CompleteWaitByTokenRow | None:
    """CompleteWaitByToken (wait_callbacks.sql).

    The wait one of whose tokens (any attempt's: awooop_wait_token, migration 0290) hashes to
    :token_hash, completed with the body as its result: the same rule as the scheduler's
    CompleteWait (awooop_end_wait, migration 0160), so the first outcome wins whichever path or
    token posts it. No row: no wait has this token.
    """
    return cast(
        "CompleteWaitByTokenRow | None",
        await db.fetchrow(COMPLETE_WAIT_BY_TOKEN.sql, result, actor, token_hash, timeout=query_timeout),
    )
