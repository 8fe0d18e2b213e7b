"""Generated from waits.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "waits.sql")
CREATE_WAIT = Q["CreateWait"]
PARK_ON_WAIT = Q["ParkOnWait"]
COMPLETE_WAIT = Q["CompleteWait"]
EXPIRE_WAITS = Q["ExpireWaits"]
MATCH_EVENT_WAITS = Q["MatchEventWaits"]
MATCHED_EVENT_WAIT_RUNS = Q["MatchedEventWaitRuns"]
DUE_WAIT_RUNS = Q["DueWaitRuns"]
RUN_STATE = Q["RunState"]
EXPIRE_WAIT = Q["ExpireWait"]
LIST_WAITS = Q["ListWaits"]
WAIT_PROJECT = Q["WaitProject"]


class CreateWaitRow(Protocol):
    """A row of CreateWait."""

    @overload
    def __getitem__(self, key: Literal["wait_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["kind"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["completed_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["created"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["issued"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ParkOnWaitRow(Protocol):
    """A row of ParkOnWait."""

    @overload
    def __getitem__(self, key: Literal["cur_run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["cur_project"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["cur_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["cur_attempt"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["cur_cancel"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["cur_reaped_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["cur_heartbeat_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["cur_worker"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["cur_keys"], /) -> list[str] | None: ...
    @overload
    def __getitem__(self, key: Literal["parked"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["kind"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["completed_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class CompleteWaitRow(Protocol):
    """A row of CompleteWait."""

    @overload
    def __getitem__(self, key: Literal["outcome"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["run_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["resumed"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["completed_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["kind"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ExpireWaitsRow(Protocol):
    """A row of ExpireWaits."""

    @overload
    def __getitem__(self, key: Literal["outcome"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["run_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["resumed"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["completed_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["kind"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class MatchEventWaitsRow(Protocol):
    """A row of MatchEventWaits."""

    @overload
    def __getitem__(self, key: Literal["outcome"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["run_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["resumed"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["completed_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["kind"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class MatchedEventWaitRunsRow(Protocol):
    """A row of MatchedEventWaitRuns."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class DueWaitRunsRow(Protocol):
    """A row of DueWaitRuns."""

    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class RunStateRow(Protocol):
    """A row of RunState."""

    @overload
    def __getitem__(self, key: Literal["cur_run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: Literal["cur_project"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["cur_status"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["cur_attempt"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["cur_reaped_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["cur_heartbeat_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ExpireWaitRow(Protocol):
    """A row of ExpireWait."""

    @overload
    def __getitem__(self, key: Literal["outcome"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["run_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["resumed"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["completed_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["kind"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ListWaitsRow(Protocol):
    """A row of ListWaits."""

    @overload
    def __getitem__(self, key: Literal["run_project"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["step_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["kind"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["expires_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["result"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["completed_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["completed_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class WaitProjectRow(Protocol):
    """A row of WaitProject."""

    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def create_wait(
    db: sql.Queryable,
    /,
    *,
    run_id: UUID | str | None,
    attempt: int | None,
    projects: Sequence[str | None] | None,
    step_id: str | None,
    kind: str | None,
    timeout: float | None,
    match_channel: str | None,
    match_key: str | None,
    lookback: float | None,
    token_hash: bytes | None,
    query_timeout: float | None = None,
) -> CreateWaitRow | None:
    """CreateWait (waits.sql).

    The wait named :step_id of the caller's run, created open with its expiry (an event wait with
    its match: channel, correlation key and the look-back its events may arrive in), or the one an
    earlier attempt (or an earlier call of this attempt) created: the handler runs again from the
    top after a resume and must find the same wait. An open token wait gets the caller's token
    (:token_hash) as one more that completes it (awooop_wait_token, migration 0290): the answer that
    carried an earlier one may have been lost (its attempt crashed before it parked), or it was
    handed out already and must keep working; `issued` says whether the caller's token was added.
    The conflict's no-op update locks the wait, so a completion ending it meanwhile is seen as
    ended here and no token is issued for it. The lease is checked, not locked: a wait written for a
    run whose lease was lost meanwhile is found by the run's next attempt, which is what it is for.
    """
    return cast(
        "CreateWaitRow | None",
        await db.fetchrow(
            CREATE_WAIT.sql,
            run_id,
            attempt,
            projects,
            step_id,
            kind,
            timeout,
            match_channel,
            match_key,
            lookback,
            token_hash,
            timeout=query_timeout,
        ),
    )


async def park_on_wait(
    db: sql.Queryable,
    /,
    *,
    wait_id: UUID | str | None,
    run_id: UUID | str | None,
    attempt: int | None,
    projects: Sequence[str | None] | None,
    actor: str | None,
    query_timeout: float | None = None,
) -> ParkOnWaitRow | None:
    """ParkOnWait (waits.sql).

    The caller's run parks on its wait: RUNNING -> WAITING_TOOL with no lease (runstate PARK). The
    attempt's token is spent (attempt_count + 1) so nothing the parked attempt still sends (a
    heartbeat, a journal write, a FailRun) can touch the run; released_count + 2 keeps the attempts
    used (attempt_count - released_count) where the claim left them minus this one, as an approval
    hand-back does. Parks only while the wait is open; an ended wait answers its outcome instead
    (the run goes on). `w` is locked before the run (`cur` reads it first).
    """
    return cast(
        "ParkOnWaitRow | None",
        await db.fetchrow(PARK_ON_WAIT.sql, wait_id, run_id, attempt, projects, actor, timeout=query_timeout),
    )


async def complete_wait(
    db: sql.Queryable,
    /,
    *,
    wait_id: UUID | str | None,
    result: object,
    actor: str | None,
    projects: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> CompleteWaitRow | None:
    """CompleteWait (waits.sql).

    A wait ended by the RPC CompleteWait: the first outcome wins (awooop_end_wait). A children wait
    (migration 0190) of the caller's projects ends only by its children: no row, nothing ended.
    """
    return cast(
        "CompleteWaitRow | None",
        await db.fetchrow(COMPLETE_WAIT.sql, wait_id, result, actor, projects, timeout=query_timeout),
    )


async def expire_waits(
    db: sql.Queryable,
    /,
    *,
    only: UUID | str | None,
    batch: int | None,
    actor: str | None,
    query_timeout: float | None = None,
) -> list[ExpireWaitsRow]:
    """ExpireWaits (waits.sql).

    The timeout sweep: open waits past their expiry end timed_out, and runs parked on them are
    re-queued (the handler sees the timeout). SKIP LOCKED batches, so several scheduler replicas
    sweep without waiting on each other; :only restricts it to one run's waits (the pass's fallback
    when a batch failed for one run's data).
    """
    return cast("list[ExpireWaitsRow]", await db.fetch(EXPIRE_WAITS.sql, only, batch, actor, timeout=query_timeout))


async def match_event_waits(
    db: sql.Queryable,
    /,
    *,
    only: UUID | str | None,
    batch: int | None,
    actor: str | None,
    query_timeout: float | None = None,
) -> list[MatchEventWaitsRow]:
    """MatchEventWaits (waits.sql).

    The event matcher: each open event wait takes the earliest event of its project and channel
    whose match key (awooop_event_key, migration 0171: an API event's correlation key, a Telegram
    message's chat, an Alertmanager resolve's group) is the wait's and that arrived since the
    wait's look-back began, and ends completed with it (awooop_end_wait: the first outcome wins,
    a parked run resumes).
    Every event is a run of its own (the channel's run), so the event is found by the key its run
    was created with (awooop_run_created, migration 0370) and read from the run: its payload is
    the run's input. SKIP LOCKED batches, as ExpireWaits.
    """
    return cast(
        "list[MatchEventWaitsRow]", await db.fetch(MATCH_EVENT_WAITS.sql, only, batch, actor, timeout=query_timeout)
    )


async def matched_event_wait_runs(
    db: sql.Queryable, /, *, batch: int | None, query_timeout: float | None = None
) -> list[MatchedEventWaitRunsRow]:
    """MatchedEventWaitRuns (waits.sql).

    The runs whose event waits a matcher batch would end, for ending them one run at a time.
    """
    return cast(
        "list[MatchedEventWaitRunsRow]", await db.fetch(MATCHED_EVENT_WAIT_RUNS.sql, batch, timeout=query_timeout)
    )


async def due_wait_runs(
    db: sql.Queryable, /, *, batch: int | None, query_timeout: float | None = None
) -> list[DueWaitRunsRow]:
    """DueWaitRuns (waits.sql).

    The runs whose waits a sweep batch would end, for ending them one run at a time.
    """
    return cast("list[DueWaitRunsRow]", await db.fetch(DUE_WAIT_RUNS.sql, batch, timeout=query_timeout))


async def run_state(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> RunStateRow | None:
    """RunState (waits.sql).

    The run's state when CreateWait found no lease, to choose its error as a fenced write does.
    """
    return cast("RunStateRow | None", await db.fetchrow(RUN_STATE.sql, run_id, timeout=query_timeout))


async def expire_wait(
    db: sql.Queryable,
    /,
    *,
    wait_id: UUID | str | None,
    actor: str | None,
    projects: Sequence[str | None] | None,
    query_timeout: float | None = None,
) -> ExpireWaitRow | None:
    """ExpireWait (waits.sql).

    A wait ended by hand (the RPC ExpireWait, an operator with the approver role): timed out now,
    whatever its expiry; the first outcome wins (awooop_end_wait), and its audit row names the
    operator as actor. A sleep ended so is woken early. An open wait of a run that is over is
    refused ('run_ended', migration 0240) and left to the sweep, as a completion of it is.
    """
    return cast(
        "ExpireWaitRow | None", await db.fetchrow(EXPIRE_WAIT.sql, wait_id, actor, projects, timeout=query_timeout)
    )


async def list_waits(
    db: sql.Queryable, /, *, run_id: UUID | str | None, query_timeout: float | None = None
) -> list[ListWaitsRow]:
    """ListWaits (waits.sql).

    A run's waits for ListWaits (`awooop runs waits list`, the console's run page): one row with
    the run's project and NULL wait columns when it has none; no row when the run does not exist.
    """
    return cast("list[ListWaitsRow]", await db.fetch(LIST_WAITS.sql, run_id, timeout=query_timeout))


async def wait_project(
    db: sql.Queryable, /, *, wait_id: UUID | str | None, query_timeout: float | None = None
) -> WaitProjectRow | None:
    """WaitProject (waits.sql).

    The project of a wait ExpireWait found outside the caller's projects, to choose its error.
    """
    return cast("WaitProjectRow | None", await db.fetchrow(WAIT_PROJECT.sql, wait_id, timeout=query_timeout))
