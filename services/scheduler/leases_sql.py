"""Generated from leases.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "leases.sql")
HEARTBEAT = Q["Heartbeat"]


class HeartbeatRow(Protocol):
    """A row of Heartbeat."""

    @overload
    def __getitem__(self, key: Literal["ord"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["lease_until"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["cancel_requested"], /) -> bool: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def heartbeat(
    db: sql.Queryable,
    /,
    *,
    run_ids: Sequence[UUID | str | None] | None,
    attempts: Sequence[int | None] | None,
    worker_id: str | None,
    worker_projects: Sequence[str | None] | None,
    lease_secs: float | None,
    query_timeout: float | None = None,
) -> list[HeartbeatRow]:
    """Heartbeat (leases.sql).

    ONE statement for a whole batch of leases: :run_ids and :attempts (same order), :worker_id,
    :lease_secs, :worker_projects (the projects where the caller is a worker; NULL: all). Returns the
    positions (1-based) of the renewed leases; the others are lost. A lease is renewed while the run
    is RUNNING/WAITING_TOOL with the caller as worker and the same fencing token, also after
    lease_until passed as long as the reaper has not taken it yet (the reaper re-checks expiry under
    the row lock, so a renewal and a reap never both win).

    Rows are locked in run_id order (`locked`), as CompleteRuns locks them, so a worker's heartbeat
    and its batched completions on the same runs can never deadlock each other. The status test is
    wrapped in `IS TRUE` (status is NOT NULL: same meaning) so that it does not match the predicate
    of awooop_run_leased_idx: the planner, which believes that partial index nearly empty, otherwise
    scans all of it and compares every leased run with every lease of the call (leases held x batch)
    instead of one primary-key probe per lease (300 leases held: 2x the heartbeat's cost). Both
    reads of awooop_run_state also name the runs as `run_id = ANY(:run_ids)`: an index condition of
    their own, so a plan made while the table was empty or small (a prepared statement's generic
    plan; services/common/planner.py) still probes the primary key per lease instead of reading the
    whole index and joining. The update sets no indexed column (migration 0040), so it is a HOT
    update.
    """
    return cast(
        "list[HeartbeatRow]",
        await db.fetch(HEARTBEAT.sql, run_ids, attempts, worker_id, worker_projects, lease_secs, timeout=query_timeout),
    )
