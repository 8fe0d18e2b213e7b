"""Generated from notifier.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "notifier.sql")
CLAIM_ALERTS = Q["ClaimAlerts"]
FINISH_ALERT = Q["FinishAlert"]


class ClaimAlertsRow(Protocol):
    """A row of ClaimAlerts."""

    @overload
    def __getitem__(self, key: Literal["alert_id"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["tool_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["error"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["redis_sent_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["telegram_sent_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["attempts"], /) -> int: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def claim_alerts(
    db: sql.Queryable, /, *, batch: int | None, query_timeout: float | None = None
) -> list[ClaimAlertsRow]:
    """ClaimAlerts (notifier.sql).

    Undelivered alerts, oldest first, that no replica holds: held for 60 seconds (an alert claimed
    by a replica that died is retried after that), attempts counts the delivery passes.
    """
    return cast("list[ClaimAlertsRow]", await db.fetch(CLAIM_ALERTS.sql, batch, timeout=query_timeout))


async def finish_alert(
    db: sql.Queryable,
    /,
    *,
    redis_sent: bool | None,
    telegram_sent: bool | None,
    last_error: str | None,
    done: bool | None,
    alert_id: int | None,
    query_timeout: float | None = None,
) -> str:
    """FinishAlert (notifier.sql).

    The pass's outcome: a channel's sent time is written once; done ends delivery.
    """
    return await db.execute(
        FINISH_ALERT.sql, redis_sent, telegram_sent, last_error, done, alert_id, timeout=query_timeout
    )
