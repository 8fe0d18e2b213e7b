"""Generated from keyids.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "keyids.sql")
LIVE_KEY_IDS = Q["LiveKeyIds"]


class LiveKeyIdsRow(Protocol):
    """A row of LiveKeyIds."""

    @overload
    def __getitem__(self, key: Literal["key_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def live_key_ids(db: sql.Queryable, /, *, query_timeout: float | None = None) -> list[LiveKeyIdsRow]:
    """LiveKeyIds (keyids.sql).

    Every key id that is not revoked (the whole set, refreshed at most once per interval).
    """
    return cast("list[LiveKeyIdsRow]", await db.fetch(LIVE_KEY_IDS.sql, timeout=query_timeout))
