"""Generated from store.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "store.sql")
STORE_EVENTS = Q["StoreEvents"]
FIND_STORED_EVENTS = Q["FindStoredEvents"]
CREATE_RUN = Q["CreateRun"]


class StoreEventsRow(Protocol):
    """A row of StoreEvents."""

    @overload
    def __getitem__(self, key: Literal["ord"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["created"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["ttl_left"], /) -> float | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class FindStoredEventsRow(Protocol):
    """A row of FindStoredEvents."""

    @overload
    def __getitem__(self, key: Literal["ord"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["ttl_left"], /) -> float | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class CreateRunRow(Protocol):
    """A row of CreateRun."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["provider_event_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["created_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["traceparent"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["max_attempts"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["priority"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["child_depth"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["child_seq"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["parent_run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["parent_step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["concurrency_keys"], /) -> list[str] | None: ...
    @overload
    def __getitem__(self, key: Literal["retry_policy"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["input"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["approval_token_hash"], /) -> bytes | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_summary"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_decided_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["approval_decided_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_started_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["compensation_completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["reaped_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["released_count"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["cancel_requested"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["failure_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["error_code"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["saga_status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["output"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["wait_key"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["not_before"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["attempt_count"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["worker_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["lease_until"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["heartbeat_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["updated_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["build_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["auto_upgrade"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["required_labels"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["preferred_labels"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["sticky_worker"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def store_events(
    db: sql.Queryable,
    /,
    *,
    ords: Sequence[int | None] | None,
    project_ids: Sequence[str | None] | None,
    channels: Sequence[str | None] | None,
    provider_event_ids: Sequence[str | None] | None,
    run_ids: Sequence[UUID | str | None] | None,
    inputs: Sequence[str | None] | None,
    max_attempts: Sequence[int | None] | None,
    not_befores: Sequence[datetime | None] | None,
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
    retention: float | None,
    query_timeout: float | None = None,
) -> list[StoreEventsRow]:
    """StoreEvents (store.sql).

    The whole first-arrival path for any number of events in ONE statement (so one round trip
    and one transaction): dedupe rows ON CONFLICT DO NOTHING, a PENDING run and a RUN_CREATED
    audit row for each dedupe row actually inserted, and the existing run_id for each event that
    was already there. The dedupe row and its run are written by the same statement, so neither
    ever exists without the other. Run ids come from the caller (:run_ids), so the statement joins
    the inserted dedupe rows to their runs without a second key lookup.
    A statement's runs are created a microsecond apart in the order of its events (:ords), so the
    claim (oldest created_at first) hands out the events of one delivery (LINE sends several) and
    of one batch in the order they were sent, not in whatever order equal timestamps come back.
    Rows are inserted in key order so that two batches sharing keys lock them in the same order
    and cannot deadlock. The final join sees dedupe rows committed before the statement began; a
    row committed by a concurrent request while we waited on it shows up as run_id NULL and is
    read by FindStoredEvents in a follow-up statement.
    A new run's max_attempts: the request's (0: unset), else its effective retry policy's
    (:policy_defaults, then its project's, then its own; services/common/retry_policy.py).
    :concurrency_keys holds each run's keys joined by spaces (unnest takes no ragged arrays).
    The wake-up NOTIFY is not part of this statement: it is sent after the commit
    (services/ingest/wakeup.py explains why).
    """
    return cast(
        "list[StoreEventsRow]",
        await db.fetch(
            STORE_EVENTS.sql,
            ords,
            project_ids,
            channels,
            provider_event_ids,
            run_ids,
            inputs,
            max_attempts,
            not_befores,
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
            retention,
            timeout=query_timeout,
        ),
    )


async def find_stored_events(
    db: sql.Queryable,
    /,
    *,
    retention: float | None,
    ords: Sequence[int | None] | None,
    project_ids: Sequence[str | None] | None,
    channels: Sequence[str | None] | None,
    provider_event_ids: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> list[FindStoredEventsRow]:
    """FindStoredEvents (store.sql).

    The run of each event whose dedupe row a concurrent request committed after StoreEvents took
    its snapshot, with the seconds that row has left before retention (:retention) prunes it.
    """
    return cast(
        "list[FindStoredEventsRow]",
        await db.fetch(
            FIND_STORED_EVENTS.sql, retention, ords, project_ids, channels, provider_event_ids, timeout=query_timeout
        ),
    )


async def create_run(
    db: sql.Queryable,
    /,
    *,
    project_id: str | None,
    input: str | None,
    max_attempts: int | None,
    policy_defaults: str | None,
    retry_policy: str | None,
    principal_id: str | None,
    not_before: datetime | None,
    priority: int | None,
    concurrency_keys: Sequence[str | None] | None,
    traceparent: str | None,
    auto_upgrade: bool | None,
    required_labels: str | None,
    preferred_labels: str | None,
    actor: str | None,
    idempotency_key: str | None,
    query_timeout: float | None = None,
) -> CreateRunRow | None:
    """CreateRun (store.sql).

    A PENDING run of the API channel (CreateRun) with its RUN_CREATED audit row, in one statement;
    the idempotency key is recorded in the audit row (the run has no provider_event_id: its dedupe
    is the idempotency key table). max_attempts as StoreEvents'; a requested delay (:not_before)
    is the run's wait_reason 'delayed'. Returns the run (every column: RunRow).
    """
    return cast(
        "CreateRunRow | None",
        await db.fetchrow(
            CREATE_RUN.sql,
            project_id,
            input,
            max_attempts,
            policy_defaults,
            retry_policy,
            principal_id,
            not_before,
            priority,
            concurrency_keys,
            traceparent,
            auto_upgrade,
            required_labels,
            preferred_labels,
            actor,
            idempotency_key,
            timeout=query_timeout,
        ),
    )
