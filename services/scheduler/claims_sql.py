"""Generated from claims.sql by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast, overload
from uuid import UUID

from services.common import sql

Q = sql.load(__file__, "claims.sql")
CLAIM_RUNS = Q["ClaimRuns"]
SECONDS_UNTIL_READY = Q["SecondsUntilReady"]
HAND_BACK_UNDELIVERED = Q["HandBackUndelivered"]
REPLAY_CLAIM_ANSWER = Q["ReplayClaimAnswer"]
PRUNE_CLAIM_ANSWERS = Q["PruneClaimAnswers"]


class ClaimRunsRow(Protocol):
    """A row of ClaimRuns."""

    @overload
    def __getitem__(self, key: Literal["item"], /) -> int | None: ...
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
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["provider_event_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["created_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["traceparent"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["max_attempts"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["priority"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["child_depth"], /) -> int | None: ...
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
    def __getitem__(self, key: Literal["released_count"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["cancel_requested"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["failure_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["error_code"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["saga_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["output"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["wait_key"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["not_before"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["attempt_count"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["worker_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["lease_until"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["heartbeat_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["updated_at"], /) -> datetime | None: ...
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
    def __getitem__(self, key: Literal["from_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["upd_item"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["prev_worker"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["comp_trigger"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["claim_wait"], /) -> float | None: ...
    @overload
    def __getitem__(self, key: Literal["parked"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["recorded"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class HandBackUndeliveredRow(Protocol):
    """A row of HandBackUndelivered."""

    @overload
    def __getitem__(self, key: Literal["handed_back"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["notified"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["recorded"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


class ReplayClaimAnswerRow(Protocol):
    """A row of ReplayClaimAnswer."""

    @overload
    def __getitem__(self, key: Literal["first_projects"], /) -> list[str]: ...
    @overload
    def __getitem__(self, key: Literal["first_max_runs"], /) -> int: ...
    @overload
    def __getitem__(self, key: Literal["first_lease_ttl"], /) -> float: ...
    @overload
    def __getitem__(self, key: Literal["first_claimed_at"], /) -> datetime: ...
    @overload
    def __getitem__(self, key: Literal["run_id"], /) -> UUID | None: ...
    @overload
    def __getitem__(self, key: Literal["project_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["channel_type"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["provider_event_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["created_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["created_by"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["traceparent"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["max_attempts"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["priority"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["child_depth"], /) -> int | None: ...
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
    def __getitem__(self, key: Literal["released_count"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["cancel_requested"], /) -> bool | None: ...
    @overload
    def __getitem__(self, key: Literal["failure_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["error_code"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["saga_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["output"], /) -> Any: ...
    @overload
    def __getitem__(self, key: Literal["wait_key"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["wait_reason"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["not_before"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["attempt_count"], /) -> int | None: ...
    @overload
    def __getitem__(self, key: Literal["worker_id"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["lease_until"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["heartbeat_at"], /) -> datetime | None: ...
    @overload
    def __getitem__(self, key: Literal["updated_at"], /) -> datetime | None: ...
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
    def __getitem__(self, key: Literal["from_status"], /) -> str | None: ...
    @overload
    def __getitem__(self, key: Literal["claim_wait"], /) -> float | None: ...
    @overload
    def __getitem__(self, key: str, /) -> object: ...

    def __getitem__(self, key: str, /) -> Any: ...


async def claim_runs(
    db: sql.Queryable,
    /,
    *,
    run_ids: Sequence[UUID | str | None] | None,
    attempts: Sequence[int | None] | None,
    outputs: Sequence[str | None] | None,
    allowed: Sequence[str | None] | None,
    worker_projects: Sequence[str | None] | None,
    principal: str | None,
    worker_id: str | None,
    claim_id: str | None,
    projects: Sequence[str | None] | None,
    build_id: str | None,
    labels: str | None,
    prefer_secs: float | None,
    live_secs: float | None,
    lease_secs: float | None,
    actor: str | None,
    sorted_projects: Sequence[str | None] | None,
    count: int,
    max_runs: int,
    query_timeout: float | None = None,
) -> list[ClaimRunsRow]:
    """ClaimRuns (claims.sql).

    ClaimRuns (carrying completions or not) and CompleteRuns, in one statement and one commit: the
    items (ClaimRunsRequest.complete, CompleteRuns' runs; empty arrays when the call has none) are
    completed first, then up to max_runs runs of `count` distinct projects (:projects) are
    claimed for :worker_id, leases of :lease_secs seconds. CompleteRuns alone is this statement
    with no projects and max_runs 0 (batch_complete.COMPLETE_MANY): nothing is scanned for a claim.
    The completions never touch a claimed row: `upd` changes rows that are RUNNING in the
    statement's snapshot, the claim rows that are PENDING/RESUMED in it.

    Rows: one per item, in item order: the locked row's state (cur_*; NULL when the run does not
    exist) and, when this item completed the run, the changed row (run_id not NULL); then the
    claimed runs (item NULL: the run columns with the run's place in its tree, from_status,
    claim_wait: seconds since the run became claimable), higher priority first, then oldest; no
    run claimed: one row with NULL run columns.
    Every row carries `parked` (runs this statement parked behind full keys) and `recorded` (an
    answer was recorded for the claim id before: nothing was claimed, the call replays it).

    The completions. :run_ids, :attempts, :outputs (JSON text) in request order; :allowed the
    statuses CompleteRun may start from (runstate.TRANSITIONS), :worker_projects the projects where
    the caller is a worker (NULL: all). Per item the rules are CompleteRun's (fenced_writes.sql
    CompleteRun): the same SET list, fence and audit row. cur locks the rows in run_id order, so
    overlapping batches wait for each other instead of deadlocking. win: a run named twice is
    completed at most once, by the first item whose token names the current attempt. held_keys:
    the concurrency keys of the runs it completes and of those it picks, locked in key order in one
    pass before `upd` starts; the triggers that give the completed runs' slots back then find them
    held. Taken run by run, in the order the rows happen to be updated, they could close a cycle (a
    deadlock) with a claim or a batch sharing the keys. RECURSIVE (nothing recurses) lets held_keys
    name `picked`, which comes later in the list. The status test is wrapped in `IS TRUE` (status is
    NOT NULL: same meaning) so the planner cannot match it to the predicate of
    awooop_run_leased_idx: believing that partial index nearly empty, it would scan all of it and
    compare every leased run with every item (leases held x batch) instead of one primary-key probe
    per item.

    prior: the answer recorded for (principal, worker id, claim id), one primary-key probe
    (services/scheduler/claim_answers.py); when there is one, the scans never start (a one-time
    filter). recorded: the claimed runs as (run_id, attempt) pairs and the claim's parameters,
    inserted only when the claim took runs and carries a claim id (an empty claim records nothing,
    so a long-poll's next round or a retry claims as usual).

    picked: per project, the ordered scan of the claim index, LIMIT max_runs, FOR UPDATE SKIP LOCKED
    (its scan starts after `cur` locked the items: a one-time filter). A queued run is claimable
    past its not_before (a retry backoff or a requested delay) with attempts left (ReleaseRun and
    approval hand-backs are not spent attempts: attempt_count - released_count); higher priority
    first, then the earliest due (not_before, else creation). awooop_run_claim_idx is (project_id,
    priority DESC, due), so each scan reads the runs in that order and stops after max_runs ready
    ones; equality on project_id keeps the index order, so the cost does not grow with the backlog
    (`project_id = ANY(...)` would sort every pending run of the projects on each claim). When fewer
    than max_runs are ready the scan goes on into the runs not due yet (parked, delayed): the due
    bound is the index's own expression, so they are passed over inside the index instead of read
    from the heap one by one for not_before (a claim of a project with 10,000 parked runs and none
    ready read all 10,000). The bound is a second later than now(), so it never leaves out a run the
    exact filter before it takes (StoreEvents spaces a batch's created_at by a microsecond an event,
    from its transaction's start); a run created more than a second ahead of a claim's clock (the
    clock stepped back) waits for a claim that comes after its creation time. A paused
    project is left out of the projects scanned (PauseProject). Then max_runs of those, interleaved
    by the projects' weights. Fairness: the k-th run of a project sorts at (k - 1 + e) / weight, e
    drawn per project and claim from Exp(1): the first run goes to a project with probability
    weight / total weight, and a claim of several runs interleaves the projects by weight, so a
    backlog in one project never holds back another's runs. Rows locked by the scans but not kept
    are released when the statement's transaction ends.

    Versions (migration 0390; docs/versioning.md): :build_id is the claiming worker's build ('': it
    declared none; not NULL, which a custom plan would fold into the conditions below and, costed
    lower than the generic plan, make Postgres plan the claim on every call). A run whose journal holds steps
    (written by its build's code) goes only to
    its own build while it is pinned, and only to the project's newest build that is not draining
    (the latest first seen: `newest`; none registered: its own) when it auto-upgrades (its own
    auto_upgrade, else its project's versioning). A run with no build yet, or with an empty
    journal, goes to any build. A draining build (`draining`, DrainBuild) takes only the runs that need it: on it,
    with
    steps journaled. The claim
    records the claimer's build on the run (build_id), so a run that journals steps is on the build
    whose code wrote them.

    Labels (migration 0400; docs/flow-control.md, "Worker labels"): :labels is the claiming worker's
    labels as a JSON object ('{}': none; never NULL, for build_id's reason). A run that requires
    labels goes only to a worker whose labels contain them. A run that prefers labels goes, for
    :prefer_secs after it became ready, only to a worker that has them, unless no such worker is
    live (seen within :live_secs, awooop_worker); a run resumed after a wait or an approval goes,
    for its project's sticky_seconds, only to the worker that held it (sticky_worker, written by the
    parking only in a project with sticky resume), while that worker is live;
    a worker of another build than the sticky one's is not held back (the run may be moving to a
    new build, where the worker it sticks to cannot take it). The claim clears sticky_worker. Runs that require
    labels no live worker has are parked by the
    label sweep (workers.sql SweepLabels: not_before 'infinity', wait_reason 'labels'), so a claim
    does not pass over them one by one.

    blocked / parked / go: concurrency keys (docs/flow-control.md). A picked run is granted only
    when every one of its limited keys has a free slot and starts left in its rate window; then it
    takes one of each. awooop_grant_keys (migration 0120) locks the picked runs' limited keys in key
    order, decides them in claim order, writes the keys' counts and returns the runs it refused,
    each with the key it waits on; a claim whose picked runs carry no keys does not call it. A
    refused run is parked: behind a busy key (not_before 'infinity', wait_reason key_busy: after
    every ready run in the claim index, past the due bound of later claims' scans, until the trigger of
    migration 0120 wakes it when the key frees a slot) or until the key's rate window ends
    (rate_limited). The key rows' locks order this claim against a release of the same keys, so a
    run is never parked behind a key that has room.
    """
    st = CLAIM_RUNS.variant(count=count, max_runs=max_runs)
    return cast(
        "list[ClaimRunsRow]",
        await db.fetch(
            st.sql,
            run_ids,
            attempts,
            outputs,
            allowed,
            worker_projects,
            principal,
            worker_id,
            claim_id,
            projects,
            build_id,
            labels,
            prefer_secs,
            live_secs,
            lease_secs,
            actor,
            sorted_projects,
            timeout=query_timeout,
        ),
    )


async def seconds_until_ready(
    db: sql.Queryable, /, *, projects: Sequence[str | None] | None, count: int, query_timeout: float | None = None
) -> float | None:
    """SecondsUntilReady (claims.sql).

    When nothing is claimable: seconds until the earliest retry backoff, delay or rate-limit window
    of :projects ends (a long-polling claim re-checks then); NULL when none is pending. Only run on
    the empty path. Parked runs ('infinity') wait for a key or a wait, not a time. Per project, the
    first entry of awooop_run_delayed_idx past now() (migration 0270), however many runs are queued.
    {{count}} is the number of projects: with it in the text Postgres keeps one plan for the
    statement instead of planning it on every call (an array parameter's length is unknown to a
    generic plan, which then costs it as ten projects).
    """
    st = SECONDS_UNTIL_READY.variant(count=count)
    return cast("float | None", await db.fetchval(st.sql, projects, timeout=query_timeout))


async def hand_back_undelivered(
    db: sql.Queryable,
    /,
    *,
    run_ids: Sequence[UUID | str | None] | None,
    attempts: Sequence[int | None] | None,
    from_statuses: Sequence[str | None] | None,
    worker_id: str | None,
    actor: str | None,
    reason: str | None,
    query_timeout: float | None = None,
) -> list[HandBackUndeliveredRow]:
    """HandBackUndelivered (claims.sql).

    The hand-back (runstate Action.HAND_BACK; services/scheduler/hand_back.py decides when): runs a
    claim took but did not deliver (left out of the answer, or their caller is gone) go back in one
    statement, as a ReleaseRun would (released_count + 1: the attempt does not count), to the status
    they were claimed from. :run_ids, :attempts, :from_statuses in the same order; :worker_id the
    claim's worker; :reason says why (the audit reason). A run whose cancel was requested in between
    is left to the reaper (which ends it as cancelled). The audit details carry no `released`: a
    repeat of a ReleaseRun never matches a hand-back (replays.sql ReleasedBy).
    """
    return cast(
        "list[HandBackUndeliveredRow]",
        await db.fetch(
            HAND_BACK_UNDELIVERED.sql, run_ids, attempts, from_statuses, worker_id, actor, reason, timeout=query_timeout
        ),
    )


async def replay_claim_answer(
    db: sql.Queryable,
    /,
    *,
    principal: str | None,
    worker_id: str | None,
    claim_id: str | None,
    query_timeout: float | None = None,
) -> list[ReplayClaimAnswerRow]:
    """ReplayClaimAnswer (claims.sql).

    The answer recorded for a claim id (:principal, :worker_id, :claim_id; claim_answers.py): its
    parameters, and its runs that still hold the lease it granted (same attempt, still RUNNING or
    WAITING_TOOL, same worker; lease_until as renewed since), in the claim's answer order. One row
    with NULL run columns when none does; no row when none is recorded.
    """
    return cast(
        "list[ReplayClaimAnswerRow]",
        await db.fetch(REPLAY_CLAIM_ANSWER.sql, principal, worker_id, claim_id, timeout=query_timeout),
    )


async def prune_claim_answers(db: sql.Queryable, /, *, batch: int | None, query_timeout: float | None = None) -> str:
    """PruneClaimAnswers (claims.sql).

    Answers whose lease would have expired unrenewed: up to :batch per statement, picked with SKIP
    LOCKED so that replicas prune disjoint rows.
    """
    return await db.execute(PRUNE_CLAIM_ANSWERS.sql, batch, timeout=query_timeout)
