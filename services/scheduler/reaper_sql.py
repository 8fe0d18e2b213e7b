"""Generated from reaper.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "reaper.sql")
REAP_EXPIRED_LEASES = Q["ReapExpiredLeases"]
EXPIRED_LEASES = Q["ExpiredLeases"]


class ReapExpiredLeasesRow(Protocol):
    """A row of ReapExpiredLeases."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["failure_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["trigger"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["notified"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ExpiredLeasesRow(Protocol):
    """A row of ExpiredLeases."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def reap_expired_leases(
    db: sql.Queryable,
    /,
    *,
    policy: str | None,
    only_run: UUID | str | None,
    batch: int | None,
    actor: str | None,
    channel: str | None,
    query_timeout: float | None = None,
) -> list[ReapExpiredLeasesRow]:
    """ReapExpiredLeases (reaper.sql).

    RUNNING / WAITING_TOOL runs whose lease expired go back to PENDING while attempts are left, else
    FAILED "Max retry attempts exceeded" (seed 000 D3; error code E-RUN-MAX-ATTEMPTS); a run with a
    pending cancel becomes CANCELLED instead. WAITING_APPROVAL holds no lease and is never touched,
    nor is a run parked on a durable wait (WAITING_TOOL without a worker: not in the leased index).
    Up to :batch runs; :only_run one run only (NULL: any; the pass's fallback when a batch failed
    for one run's data); :policy the service's retry policy (JSON text); :channel the wake-up
    channel.

    `expired` picks expired leases with FOR UPDATE SKIP LOCKED (replicas take disjoint rows and never
    wait on a worker's write). Locking re-checks expiry in this same statement: a row whose
    heartbeat committed after our snapshot is re-read at its newest version and dropped when
    `lease_until < now()` no longer holds (READ COMMITTED re-evaluation), and once locked nobody can
    renew it before the UPDATE. The scan reads awooop_run_leased_idx (partial: leased runs only,
    keyed by run_id so that heartbeats are HOT updates; expiry is checked on the row) and the UPDATE
    joins by primary key, so its cost grows with the leases held, not with finished runs. (Repeating
    the status/expiry filter in the UPDATE made the planner join through the partial index instead,
    a nested loop of batch x batch rows: 6x slower at 1M finished runs.)

    A reaped lease counts as a failure of its attempt: while attempts are left the run waits the
    backoff its retry policy gives that many attempts used (awooop_retry_delay over
    awooop_effective_retry_policy, migration 0135), as after a retryable FailRun, so a handler that
    crashes its worker every time backs off too. The audit rows, compensation requests
    (awooop_request_compensation, migration 0210) and wake-up NOTIFY are written by the same
    statement (as in fenced_writes.sql).
    """
    return cast(
        "list[ReapExpiredLeasesRow]",
        await db.fetch(REAP_EXPIRED_LEASES.sql, policy, only_run, batch, actor, channel, timeout=query_timeout),
    )


async def expired_leases(
    db: sql.Queryable, /, *, batch: int | None, query_timeout: float | None = None
) -> list[ExpiredLeasesRow]:
    """ExpiredLeases (reaper.sql).

    The runs a reaper batch would take, for reaping them one at a time.
    """
    return cast("list[ExpiredLeasesRow]", await db.fetch(EXPIRED_LEASES.sql, batch, timeout=query_timeout))
