"""Generated from debounce.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "debounce.sql")
LOCK_DEBOUNCE_WINDOWS = Q["LockDebounceWindows"]
LOCK_OPEN_BATCHES = Q["LockOpenBatches"]
RECORD_DEBOUNCED_EVENTS = Q["RecordDebouncedEvents"]
WRITE_BATCHES = Q["WriteBatches"]
READ_DEBOUNCE_RULES = Q["ReadDebounceRules"]


class LockDebounceWindowsRow(Protocol):
    """A row of LockDebounceWindows."""

    @overload
    def __getitem__(self, key: Literal["ord"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["opened_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class LockOpenBatchesRow(Protocol):
    """A row of LockOpenBatches."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["input"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class RecordDebouncedEventsRow(Protocol):
    """A row of RecordDebouncedEvents."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["provider_event_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class WriteBatchesRow(Protocol):
    """A row of WriteBatches."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["not_before"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ReadDebounceRulesRow(Protocol):
    """A row of ReadDebounceRules."""

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
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def lock_debounce_windows(
    db: sql.Queryable,
    /,
    *,
    ords: Sequence[int | None] | None,
    project_ids: Sequence[str | None] | None,
    channels: Sequence[str | None] | None,
    keys: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> list[LockDebounceWindowsRow]:
    """LockDebounceWindows (debounce.sql).

    The window rows of the flush's keys (distinct), created when new and locked in key order either
    way (ON CONFLICT DO UPDATE locks the row it meets): an event of the same key in another
    transaction waits here until this one commits, so one key never opens two batches at once and
    two flushes sharing keys lock them in the same order. Returns the run each key's last batch was
    (NULL: never one) and when it opened; whether it is still open is read by the next statement,
    whose snapshot sees a batch a concurrent transaction committed while this one waited.
    """
    return cast(
        "list[LockDebounceWindowsRow]",
        await db.fetch(LOCK_DEBOUNCE_WINDOWS.sql, ords, project_ids, channels, keys, timeout=query_timeout),
    )


async def lock_open_batches(
    db: sql.Queryable, /, *, run_ids: Sequence[UUID | str | None] | None, query_timeout: float | None = None
) -> list[LockOpenBatchesRow]:
    """LockOpenBatches (debounce.sql).

    Of the runs the windows named, those still open as batches, locked: PENDING, waiting for
    debounce, never claimed, their quiet window not over. A claim that took the run first made it
    RUNNING (or parked it on a key, wait_reason key_busy): the row lock waits for it and the
    re-checked conditions then leave it out, so the event opens a new batch. A claim that comes
    while the row is locked here passes over it (SKIP LOCKED). Their input, which the events grow.
    """
    return cast("list[LockOpenBatchesRow]", await db.fetch(LOCK_OPEN_BATCHES.sql, run_ids, timeout=query_timeout))


async def record_debounced_events(
    db: sql.Queryable,
    /,
    *,
    project_ids: Sequence[str | None] | None,
    channels: Sequence[str | None] | None,
    provider_event_ids: Sequence[str | None] | None,
    run_ids: Sequence[UUID | str | None] | None,
    query_timeout: float | None = None,
) -> list[RecordDebouncedEventsRow]:
    """RecordDebouncedEvents (debounce.sql).

    Each event's dedupe row, naming the batch it joins (:run_ids), in key order. An event whose row
    exists is a duplicate and changes nothing: ON CONFLICT waits for a concurrent inserter of the
    same event and then leaves its row; the caller reads those rows afterwards (FindStoredEvents).
    Returns the events recorded.
    """
    return cast(
        "list[RecordDebouncedEventsRow]",
        await db.fetch(
            RECORD_DEBOUNCED_EVENTS.sql, project_ids, channels, provider_event_ids, run_ids, timeout=query_timeout
        ),
    )


async def write_batches(
    db: sql.Queryable,
    /,
    *,
    ords: Sequence[int | None] | None,
    run_ids: Sequence[UUID | str | None] | None,
    opened_ats: Sequence[datetime | None] | None,
    project_ids: Sequence[str | None] | None,
    channels: Sequence[str | None] | None,
    keys: Sequence[str | None] | None,
    provider_event_ids: Sequence[str | None] | None,
    inputs: Sequence[str | None] | None,
    window_secs: Sequence[float | None] | None,
    max_wait_secs: Sequence[float | None] | None,
    fulls: Sequence[bool | None] | None,
    max_attempts: Sequence[int | None] | None,
    priorities: Sequence[int | None] | None,
    retry_policies: Sequence[str | None] | None,
    concurrency_keys: Sequence[str | None] | None,
    traceparents: Sequence[str | None] | None,
    auto_upgrades: Sequence[bool | None] | None,
    required_labels: Sequence[str | None] | None,
    preferred_labels: Sequence[str | None] | None,
    policy_defaults: str | None,
    principal_id: str | None,
    actor: str | None,
    query_timeout: float | None = None,
) -> list[WriteBatchesRow]:
    """WriteBatches (debounce.sql).

    The batches the flush's new events went to, each with its whole new input (debounce.py builds
    it; :ords its order, a key's later batches last), and the open batches it closed (full): a new batch
    (:opened_ats NULL) is a PENDING run created as StoreEvents creates one (max
    attempts, priority, retry policy, keys, labels and traceparent of its first event), with its RUN_CREATED
    audit row, and its window row names it from now; an open batch takes the input. Either way the
    batch is due when its key has been quiet for the window, and no later than the max wait after
    its first event: not_before = least(opened + max wait, now + window); a batch that is full
    (:fulls, debounce.py's MAX_BATCH_EVENTS) is due now, which closes it.
    """
    return cast(
        "list[WriteBatchesRow]",
        await db.fetch(
            WRITE_BATCHES.sql,
            ords,
            run_ids,
            opened_ats,
            project_ids,
            channels,
            keys,
            provider_event_ids,
            inputs,
            window_secs,
            max_wait_secs,
            fulls,
            max_attempts,
            priorities,
            retry_policies,
            concurrency_keys,
            traceparents,
            auto_upgrades,
            required_labels,
            preferred_labels,
            policy_defaults,
            principal_id,
            actor,
            timeout=query_timeout,
        ),
    )


async def read_debounce_rules(
    db: sql.Queryable,
    /,
    *,
    project_ids: Sequence[str | None] | None,
    channels: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> list[ReadDebounceRulesRow]:
    """ReadDebounceRules (debounce.sql).

    The debounce rules of the (project, channel) pairs a flush holds (ingest caches them for
    AWOOOP_DEBOUNCE_RULE_CACHE_SECONDS; a pair without a row has no rule).
    """
    return cast(
        "list[ReadDebounceRulesRow]",
        await db.fetch(READ_DEBOUNCE_RULES.sql, project_ids, channels, timeout=query_timeout),
    )
