"""Generated from queue.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from typing import Any, Literal, Protocol, cast, overload

from services.common import sql

Q = sql.load(__file__, "queue.sql")
SAMPLE_QUEUE = Q["SampleQueue"]
SAMPLE_WAITS = Q["SampleWaits"]


class SampleQueueRow(Protocol):
    """A row of SampleQueue."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["n"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["claimable"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["held"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["debouncing"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["waiting_for_labels"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["oldest"], /) -> float: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class SampleWaitsRow(Protocol):
    """A row of SampleWaits."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["kind"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["n"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["oldest"], /) -> float: ...
    @overload
    def __getitem__(self, key: Literal["overdue"], /) -> float: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def sample_queue(db: sql.Queryable, /, *, query_timeout: float | None = None) -> list[SampleQueueRow]:
    """SampleQueue (queue.sql).

    The queue gauges: unfinished runs by project and status, how many of them are claimable now,
    and the age of the oldest claimable run (by the time it became claimable: its last state
    change, or the end of its retry backoff or delay; GREATEST ignores a NULL not_before).
    Claimable is the claim's own test (services/scheduler/claims: a claimable status, not before
    its time, attempts left, its project not paused), written out here.
    It reads only unfinished runs: the filter is the union of the predicates of the partial
    indexes awooop_run_claim_idx (PENDING, RESUMED), awooop_run_approval_idx (WAITING_APPROVAL),
    awooop_run_leased_idx (RUNNING, WAITING_TOOL with a worker) and awooop_run_waiting_idx
    (WAITING_TOOL parked on a durable wait: no worker; migration 0161), one arm each, so the
    planner reads the four indexes (a BitmapOr) and its cost follows the backlog, not the history
    of finished runs. The paused projects are read once, as an array (an InitPlan), not probed per
    run: with sequential scans priced out (services/common/planner.py) a correlated NOT EXISTS was
    an index probe of awooop_project_flow for every unfinished run.
    held: queued runs a worker held because its code did not replay their journal (HoldRun),
    waiting for an operator. debouncing: batches of debounced channel events whose quiet window is
    still open (wait_reason 'debounce', not_before ahead; services/ingest/debounce.py).
    waiting_for_labels: queued runs the label sweep parked because no live worker has the labels they
    require (wait_reason 'labels'; services/scheduler/workers.sql).
    """
    return cast("list[SampleQueueRow]", await db.fetch(SAMPLE_QUEUE.sql, timeout=query_timeout))


async def sample_waits(db: sql.Queryable, /, *, query_timeout: float | None = None) -> list[SampleWaitsRow]:
    """SampleWaits (queue.sql).

    The durable waits' gauges: open waits by project and kind, the age of the oldest of each, and
    how long past its expiry the most overdue one is (the timeout sweep ends a wait within its
    interval of the expiry: minutes overdue means no sweep runs). Reads only open waits
    (awooop_wait_due_idx is partial on status = 'open').
    """
    return cast("list[SampleWaitsRow]", await db.fetch(SAMPLE_WAITS.sql, timeout=query_timeout))
