"""Generated from api_channel.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "api_channel.sql")
INGEST_API_EVENTS = Q["IngestApiEvents"]
RECORD_LEGACY_API_KEYS = Q["RecordLegacyApiKeys"]


class IngestApiEventsRow(Protocol):
    """A row of IngestApiEvents."""

    @overload
    def __getitem__(self, key: Literal["ord"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["created"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["request_fingerprint"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["policy_version"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["response_snapshot"], /) -> bytes | None: ...
    @overload
    def __getitem__(self, key: Literal["resource_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["legacy_run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["legacy_input"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["legacy_max_attempts"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["allowed"], /) -> bool: ...
    @overload
    def __getitem__(self, key: Literal["window_start"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["window_end"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def ingest_api_events(
    db: sql.Queryable,
    /,
    *,
    ord: Sequence[int | None] | None,
    project_id: Sequence[str | None] | None,
    key: Sequence[str | None] | None,
    run_id: Sequence[UUID | str | None] | None,
    input: Sequence[str | None] | None,
    max_attempts: Sequence[int | None] | None,
    not_before: Sequence[datetime | None] | None,
    priority: Sequence[int | None] | None,
    retry_policy: Sequence[str | None] | None,
    concurrency_keys: Sequence[str | None] | None,
    traceparent: Sequence[str | None] | None,
    fingerprint: Sequence[str | None] | None,
    snapshot: Sequence[bytes | None] | None,
    auto_upgrade: Sequence[bool | None] | None,
    required_labels: Sequence[str | None] | None,
    preferred_labels: Sequence[str | None] | None,
    debounced: Sequence[bool | None] | None,
    principal_type: str | None,
    principal_id: str | None,
    operation: str | None,
    retention: float | None,
    policy_version: str | None,
    ttl: float | None,
    defaults: str | None,
    actor: str | None,
    all_projects: str | None,
    roles: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> list[IngestApiEventsRow]:
    """IngestApiEvents (api_channel.sql).

    A batch of API events (distinct (project, key) pairs, one principal) in ONE statement: each
    event's live key row is read, or a key row is claimed and its run and RUN_CREATED audit row are
    written, or the event's key is found in the channel dedupe table of the previous release.

    A key row is claimed by INSERT ... ON CONFLICT (seed 003's alternative to the advisory lock):
    the unique index serializes requests of one scope. A request meeting a row another one is
    still inserting waits for its commit; a live row committed by then is left as it is (and stays
    unanswered here: this statement's snapshot predates it; the caller runs the statement again
    for those events, and the new snapshot replays it); an expired row is replaced, so the key
    starts afresh. Rows are inserted in key order, so two batches sharing keys lock them in the
    same order.

    A run is created for a claimed key only (claimed JOIN ev), a microsecond apart in the order of
    the batch so the claim hands them out in the order sent. The snapshot the key row keeps is
    made by the caller with the run id it generated. `allowed` is the caller's membership read by
    this statement (a replay re-checks it; a role in :all_projects counts too). Keys of the old
    rule: a dedupe row (project, 'api', key) within retention whose run this principal created,
    for an event without a live key row; such an event claims nothing.
    A debounced event (:debounced, docs/flow-control.md#debounce-and-batch) claims its key with
    :run_id its batch's run, which this statement does not write: the caller's transaction locked
    the batch before and opens or grows it after (services/ingest/debounce.py).
    """
    return cast(
        "list[IngestApiEventsRow]",
        await db.fetch(
            INGEST_API_EVENTS.sql,
            ord,
            project_id,
            key,
            run_id,
            input,
            max_attempts,
            not_before,
            priority,
            retry_policy,
            concurrency_keys,
            traceparent,
            fingerprint,
            snapshot,
            auto_upgrade,
            required_labels,
            preferred_labels,
            debounced,
            principal_type,
            principal_id,
            operation,
            retention,
            policy_version,
            ttl,
            defaults,
            actor,
            all_projects,
            roles,
            timeout=query_timeout,
        ),
    )


async def record_legacy_api_keys(
    db: sql.Queryable,
    /,
    *,
    principal_type: str | None,
    principal_id: str | None,
    operation: str | None,
    policy_version: str | None,
    ttl: float | None,
    project_id: Sequence[str | None] | None,
    key: Sequence[str | None] | None,
    fingerprint: Sequence[str | None] | None,
    snapshot: Sequence[bytes | None] | None,
    resource_id: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> str:
    """RecordLegacyApiKeys (api_channel.sql).

    The key rows of old-rule keys that were just replayed (their checks passed), so later replays
    take the ordinary path. A row recorded meanwhile by a concurrent replay is the same one; an
    expired row is replaced.
    """
    return await db.execute(
        RECORD_LEGACY_API_KEYS.sql,
        principal_type,
        principal_id,
        operation,
        policy_version,
        ttl,
        project_id,
        key,
        fingerprint,
        snapshot,
        resource_id,
        timeout=query_timeout,
    )
