"""Generated from retention.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "retention.sql")
PRUNE_DEDUPE = Q["PruneDedupe"]
PRUNE_IDEMPOTENCY_KEYS = Q["PruneIdempotencyKeys"]
PRUNE_RUNS = Q["PruneRuns"]
PRUNE_DEBOUNCE_WINDOWS = Q["PruneDebounceWindows"]


class PruneDedupeRow(Protocol):
    """A row of PruneDedupe."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["provider_event_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def prune_dedupe(
    db: sql.Queryable, /, *, retention: float | None, batch: int | None, query_timeout: float | None = None
) -> list[PruneDedupeRow]:
    """PruneDedupe (retention.sql).

    One batch of dedupe rows older than :retention seconds, oldest first; the victims are chosen
    with FOR UPDATE SKIP LOCKED, so replicas pruning at once never wait on each other or delete a
    row twice. Returns the keys, whose Redis copies go next.
    """
    return cast("list[PruneDedupeRow]", await db.fetch(PRUNE_DEDUPE.sql, retention, batch, timeout=query_timeout))


async def prune_idempotency_keys(db: sql.Queryable, /, *, batch: int | None, query_timeout: float | None = None) -> str:
    """PruneIdempotencyKeys (retention.sql).

    One batch of idempotency keys past expires_at, chosen as PruneDedupe's.
    """
    return await db.execute(PRUNE_IDEMPOTENCY_KEYS.sql, batch, timeout=query_timeout)


async def prune_runs(
    db: sql.Queryable, /, *, retention: float | None, batch: int | None, query_timeout: float | None = None
) -> str:
    """PruneRuns (retention.sql).

    One batch of finished runs (COMPLETED, FAILED, CANCELLED) last changed more than :retention
    seconds ago, with their audit rows and their event log (journal, compensation request, alerts
    and watch marks go by ON DELETE CASCADE). A run is kept while anything may still answer with it: its event's
    dedupe row (a
    provider retry replays the run), an unexpired idempotency key naming it (a CreateRun retry),
    a compensation that is not done, an alert not yet delivered, or a saga that is compensating or
    failed to compensate (an operator still has to act on it). A run that ended with nothing to
    undo has saga_status not_needed (a completed run always; migration 0080): it goes too.
    """
    return await db.execute(PRUNE_RUNS.sql, retention, batch, timeout=query_timeout)


async def prune_debounce_windows(
    db: sql.Queryable, /, *, retention: float | None, batch: int | None, query_timeout: float | None = None
) -> str:
    """PruneDebounceWindows (retention.sql).

    One batch of window rows whose batch opened more than :retention seconds ago (chosen as
    PruneDedupe chooses): a key that comes back gets a row again
    (debounce.sql's window rows; a batch is long due by then).
    """
    return await db.execute(PRUNE_DEBOUNCE_WINDOWS.sql, retention, batch, timeout=query_timeout)
