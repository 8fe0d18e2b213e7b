"""Generated from keyids.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import Literal, Protocol, cast

from services.common import sql

Q = sql.load(__file__, "keyids.sql")
LIVE_KEY_IDS = Q["LiveKeyIds"]


class LiveKeyIdsRow(Protocol):
    """A row of LiveKeyIds."""

    def __getitem__(self, key: Literal["key_id"], /) -> str: ...


async def live_key_ids(db: sql.Queryable, /, *, query_timeout: float | None = None) -> list[LiveKeyIdsRow]:
    """LiveKeyIds (keyids.sql).

    Every key id that is not revoked (the whole set, refreshed at most once per interval).
    """
    return cast("list[LiveKeyIdsRow]", await db.fetch(LIVE_KEY_IDS.sql, timeout=query_timeout))
