"""The run state machine (seed ADR-114 D4, seed 000 D2-D4): the statuses, their named sets,
and every transition with the statuses it may start from, where it may end, whether it is
fenced by the lease token, and the audit action it writes.

This module is the one place these facts are declared. The fenced writes bind their
allowed-from lists from it, and the error of a refused transition is chosen by it; the store's
CHECK constraint, the protobuf RunStatus enum and the README's diagram are checked against it,
and a test runs every (status, action) pair against the real store, so the named statements'
guards and audit actions (services/scheduler/*.sql) are held to it (tests/test_runstate.py).
Every list of statuses written out in a .sql file (statements, migrations' functions, triggers
and indexes, and the current schema, services/common/schema.sql) must be one of the sets declared
here (a named set, a status enum, or a transition's allowed_from or to_states), and a simple
`CASE status WHEN ... THEN '<audit>'` must map each status to the audit action of one
transition's outcome (tests/test_status_sets.py).

A transition is one SQL statement (services/scheduler/fenced_writes.sql, claims.sql,
approvals.sql, reaper.sql): its `WHERE` allows exactly `allowed_from`, its `SET` chooses one of
`outcomes`, and it writes the outcome's audit row in the same statement.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from services.common import errors


class RunStatus(StrEnum):
    """awooop_run_state.status (stored as these strings; RUN_STATUS_<name> in protobuf)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    WAITING_TOOL = "WAITING_TOOL"
    WAITING_APPROVAL = "WAITING_APPROVAL"
    RESUMED = "RESUMED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


S = RunStatus
STATUSES: tuple[RunStatus, ...] = tuple(RunStatus)

# Queued: a claim may take them (once past not_before: a retry backoff or a requested delay; with
# attempts left; higher priority first, then the earliest due; services/scheduler/claiming.py).
# A queued run the claim finds behind a full concurrency key stays in its status, parked
# (not_before 'infinity', wait_reason key_busy), until a run with the key leaves its lease
# (migration 0120's trigger): no status of its own, so every rule about queued runs holds for it.
CLAIMABLE: tuple[RunStatus, ...] = (S.PENDING, S.RESUMED)
# Held by a worker under a lease (renewed by Heartbeat, taken back by the reaper); the saga
# journal accepts writes only in these.
LEASED: tuple[RunStatus, ...] = (S.RUNNING, S.WAITING_TOOL)
# Waiting for something outside the worker: a tool's answer (leased) or a person (not leased).
# A run parked on a durable wait (a token, a sleep) is WAITING_TOOL with no lease: worker_id and
# lease_until are NULL, so neither the heartbeat (it matches the worker) nor the reaper (it needs
# lease_until < now()) touch it, and its attempt's token was spent when it parked (PARK).
WAITING: tuple[RunStatus, ...] = (S.WAITING_TOOL, S.WAITING_APPROVAL)
# Ended: no transition leaves them, except an operator's RedriveRuns requeuing FAILED runs.
TERMINAL: tuple[RunStatus, ...] = (S.COMPLETED, S.FAILED, S.CANCELLED)
# CancelRun applies: every status that is not terminal.
CANCELLABLE: tuple[RunStatus, ...] = tuple(s for s in STATUSES if s not in TERMINAL)
# Ended without success: a compensation may be requested for the run's journal.
COMPENSATABLE: tuple[RunStatus, ...] = (S.FAILED, S.CANCELLED)


class Action(StrEnum):
    """What may happen to a run (the RPC or background pass in brackets)."""

    CLAIM = "claim"  # ClaimRuns, CompleteRuns' claim
    HAND_BACK = "hand_back"  # ClaimRuns, of claimed runs it does not deliver (scheduler/hand_back.py)
    COMPLETE = "complete"  # CompleteRun, CompleteRuns
    FAIL = "fail"  # FailRun
    RELEASE = "release"  # ReleaseRun
    WAIT_TOOL = "wait_tool"  # WaitTool
    RESUME_TOOL = "resume_tool"  # ResumeTool
    ACKNOWLEDGE_CANCEL = "acknowledge_cancel"  # AcknowledgeCancel
    REQUEST_APPROVAL = "request_approval"  # RequestApproval
    APPROVE = "approve"  # DecideApproval (approve)
    REJECT = "reject"  # DecideApproval (reject)
    EXPIRE_APPROVAL = "expire_approval"  # the approval sweep, or a DecideApproval that finds it expired
    CANCEL = "cancel"  # CancelRun
    REAP = "reap"  # the reaper, on an expired lease
    REDRIVE = "redrive"  # RedriveRuns (an operator's bulk requeue of failed runs)
    PARK = "park"  # AwaitWait (a durable wait: scheduler/waits.py)
    COMPLETE_WAIT = "complete_wait"  # CompleteWait, or the wait's callback URL
    EXPIRE_WAIT = "expire_wait"  # the wait timeout sweep, or ExpireWait (an operator, by hand)
    HOLD = "hold"  # HoldRun (a worker whose code does not replay the run's journal)
    UNHOLD = "unhold"  # UnholdRun (an operator lets a held run be claimed again)
    SET_BUILD = "set_build"  # SetRunBuild (an operator moves a run to another worker build)


class Audit(StrEnum):
    """awooop_audit_log.action of the run transitions."""

    RUN_CREATED = "RUN_CREATED"
    CLAIMED = "CLAIMED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    RELEASED = "RELEASED"
    CANCELLED = "CANCELLED"
    CANCEL_REQUESTED = "CANCEL_REQUESTED"
    WAITING_TOOL = "WAITING_TOOL"
    TOOL_RETURNED = "TOOL_RETURNED"
    APPROVAL_REQUESTED = "APPROVAL_REQUESTED"
    APPROVED = "APPROVED"
    APPROVAL_REJECTED = "APPROVAL_REJECTED"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
    REAPED = "REAPED"
    REAPED_FAILED = "REAPED_FAILED"
    REAPED_CANCELLED = "REAPED_CANCELLED"
    REDRIVEN = "REDRIVEN"
    WAIT_PARKED = "WAIT_PARKED"
    WAIT_COMPLETED = "WAIT_COMPLETED"
    WAIT_TIMED_OUT = "WAIT_TIMED_OUT"
    WAIT_ENDED = "WAIT_ENDED"  # a wait's outcome while nobody was parked on it (no status change)
    HELD = "HELD"
    UNHELD = "UNHELD"
    BUILD_SET = "BUILD_SET"  # not a status change: an operator put the run on another build
    # not a status change: written beside one that ended FAILED/CANCELLED with steps to undo
    COMPENSATION_REQUESTED = "COMPENSATION_REQUESTED"
    # not a status change: a background loop's statement failed on this run and skipped it
    LOOP_ERROR = "LOOP_ERROR"
    # not a status change: a repeated RequestApproval of the same lease replaced a token never seen
    APPROVAL_TOKEN_REISSUED = "APPROVAL_TOKEN_REISSUED"
    # not a run's change: a project's concurrency or rate limit of a key was set or removed
    CONCURRENCY_LIMIT_SET = "CONCURRENCY_LIMIT_SET"
    # not a run's change: a project's flow settings (SetProjectFlow), its pause and resume
    PROJECT_FLOW_SET = "PROJECT_FLOW_SET"
    PROJECT_PAUSED = "PROJECT_PAUSED"
    PROJECT_RESUMED = "PROJECT_RESUMED"
    # not a run's change: a project's debounce rule of a channel was set or deleted (issue 46)
    DEBOUNCE_RULE_SET = "DEBOUNCE_RULE_SET"
    DEBOUNCE_RULE_DELETED = "DEBOUNCE_RULE_DELETED"
    # not a run's change: an operator drained a worker build of a project, or undrained it
    BUILD_DRAINED = "BUILD_DRAINED"
    BUILD_UNDRAINED = "BUILD_UNDRAINED"
    # not a run's change: an operator redrove a set of runs (each redriven run has its REDRIVEN row)
    RUNS_REDRIVEN = "RUNS_REDRIVEN"
    # not a run's change: a cron schedule was set or deleted
    SCHEDULE_SET = "SCHEDULE_SET"
    SCHEDULE_DELETED = "SCHEDULE_DELETED"


class WaitStatus(StrEnum):
    """awooop_wait.status (migration 0160): a durable wait is open until it ends, once, completed
    (its token or event came) or timed out (its time passed; a sleep always ends so)."""

    OPEN = "open"
    COMPLETED = "completed"
    TIMED_OUT = "timed_out"


class WaitKind(StrEnum):
    """awooop_wait.kind: what ends the wait besides its time."""

    TOKEN = "token"  # CompleteWait or its callback URL
    SLEEP = "sleep"  # nothing: its time
    EVENT = "event"  # an API event carrying its correlation key
    CHILDREN = "children"  # its child runs' ends (migration 0190's trigger)


@dataclass(frozen=True)
class Outcome:
    """One way a transition ends. to=None: the status stays (a cancel of a leased run only
    marks it cancel_requested)."""

    to: RunStatus | None
    audit: Audit
    when: str  # the condition, for people


@dataclass(frozen=True)
class Transition:
    action: Action
    allowed_from: tuple[RunStatus, ...]
    outcomes: tuple[Outcome, ...]
    # the caller's lease token (run_id, attempt) must name the current attempt; a stale one is LEASE_LOST
    fenced: bool
    # INVALID_TRANSITION's wording: "cannot <describe> run X in status S"
    describe: str
    # A repeat by the same lease after its first call committed (its answer lost) answers that
    # success again and writes nothing, from these statuses: for complete, COMPLETED by this
    # attempt; for fail, release, wait_tool, resume_tool and acknowledge_cancel, where they
    # leave a run, when the audit log holds this attempt's write (scheduler/replays.py); for
    # cancel (no lease), CANCELLED after this actor's cancel; for a request of approval, still
    # waiting with this attempt, with a new token in place of the lost one (scheduler/approvals.py)
    replays_from: tuple[RunStatus, ...] = ()

    @property
    def to_states(self) -> tuple[RunStatus, ...]:
        return tuple(o.to for o in self.outcomes if o.to is not None)

    def audit_for(self, to: RunStatus) -> Audit:
        for o in self.outcomes:
            if o.to == to:
                return o.audit
        raise KeyError(f"{self.action} never ends in {to}")


def _t(
    action: Action,
    allowed_from: Iterable[RunStatus],
    *outcomes: Outcome,
    fenced: bool,
    describe: str,
    replays_from: Iterable[RunStatus] = (),
) -> Transition:
    return Transition(action, tuple(allowed_from), outcomes, fenced, describe, tuple(replays_from))


TRANSITIONS: dict[Action, Transition] = {
    t.action: t
    for t in (
        _t(
            Action.CLAIM,
            CLAIMABLE,
            Outcome(S.RUNNING, Audit.CLAIMED, "past not_before (backoff, delay), attempts left; a new lease and token"),
            fenced=False,
            describe="claim",
        ),
        _t(
            Action.HAND_BACK,
            [S.RUNNING],
            Outcome(S.PENDING, Audit.RELEASED, "claimed from PENDING; not delivered; the attempt is not spent"),
            Outcome(S.RESUMED, Audit.RELEASED, "claimed from RESUMED; not delivered; the attempt is not spent"),
            fenced=False,
            describe="hand back",
        ),
        _t(
            Action.COMPLETE,
            [S.RUNNING],
            Outcome(S.COMPLETED, Audit.COMPLETED, "always"),
            fenced=True,
            describe="complete",
            replays_from=[S.COMPLETED],
        ),
        _t(
            Action.FAIL,
            LEASED,
            Outcome(
                S.PENDING,
                Audit.RETRY_SCHEDULED,
                "retryable, error code not non-retryable in the retry policy, no cancel pending, attempts left;"
                " not_before = now + the policy's backoff (wait_reason backoff)",
            ),
            Outcome(S.CANCELLED, Audit.CANCELLED, "retryable while a cancel is pending"),
            Outcome(S.FAILED, Audit.FAILED, "terminal, a non-retryable error code of the policy, or attempts used up"),
            fenced=True,
            describe="fail",
            replays_from=[S.PENDING, S.CANCELLED, S.FAILED],
        ),
        _t(
            Action.RELEASE,
            LEASED,
            Outcome(S.PENDING, Audit.RELEASED, "no cancel pending; the attempt is not spent"),
            Outcome(S.CANCELLED, Audit.CANCELLED, "a cancel is pending"),
            fenced=True,
            describe="release",
            replays_from=[S.PENDING, S.CANCELLED],
        ),
        _t(
            Action.WAIT_TOOL,
            [S.RUNNING],
            Outcome(S.WAITING_TOOL, Audit.WAITING_TOOL, "the lease is kept"),
            fenced=True,
            describe="wait for a tool on",
            replays_from=[S.WAITING_TOOL],
        ),
        _t(
            Action.RESUME_TOOL,
            [S.WAITING_TOOL],
            Outcome(S.RUNNING, Audit.TOOL_RETURNED, "always"),
            fenced=True,
            describe="resume from a tool wait",
            replays_from=[S.RUNNING],
        ),
        _t(
            Action.ACKNOWLEDGE_CANCEL,
            LEASED,
            Outcome(S.CANCELLED, Audit.CANCELLED, "a cancel was requested"),
            fenced=True,
            describe="acknowledge a cancel",
            replays_from=[S.CANCELLED],
        ),
        _t(
            Action.REQUEST_APPROVAL,
            [S.RUNNING],
            Outcome(S.WAITING_APPROVAL, Audit.APPROVAL_REQUESTED, "no cancel pending; the lease is released"),
            fenced=True,
            describe="request approval of",
            replays_from=[S.WAITING_APPROVAL],
        ),
        _t(
            Action.APPROVE,
            [S.WAITING_APPROVAL],
            Outcome(S.RESUMED, Audit.APPROVED, "the token matches and has not expired"),
            fenced=False,
            describe="decide the approval of",
        ),
        _t(
            Action.REJECT,
            [S.WAITING_APPROVAL],
            Outcome(S.FAILED, Audit.APPROVAL_REJECTED, "the token matches and has not expired"),
            fenced=False,
            describe="decide the approval of",
        ),
        _t(
            Action.EXPIRE_APPROVAL,
            [S.WAITING_APPROVAL],
            Outcome(S.FAILED, Audit.APPROVAL_EXPIRED, "the token's time is up (E-APPROVAL-002)"),
            fenced=False,
            describe="expire the approval of",
        ),
        _t(
            Action.CANCEL,
            CANCELLABLE,
            Outcome(S.CANCELLED, Audit.CANCELLED, "queued or waiting for approval: at once"),
            Outcome(None, Audit.CANCEL_REQUESTED, "leased: cancel_requested, delivered in the heartbeat reply"),
            fenced=False,
            describe="cancel",
            replays_from=[S.CANCELLED],
        ),
        _t(
            Action.REAP,
            LEASED,
            Outcome(S.PENDING, Audit.REAPED, "the lease expired, attempts left; after the policy's backoff"),
            Outcome(S.CANCELLED, Audit.REAPED_CANCELLED, "the lease expired after a cancel request"),
            Outcome(S.FAILED, Audit.REAPED_FAILED, "the lease expired, attempts used up"),
            fenced=False,
            describe="reap",
        ),
        _t(
            Action.REDRIVE,
            [S.FAILED],
            Outcome(S.PENDING, Audit.REDRIVEN, "matches the operator's filter, nothing to compensate; fresh attempts"),
            fenced=False,
            describe="redrive",
        ),
        _t(
            Action.PARK,
            [S.RUNNING],
            Outcome(
                S.WAITING_TOOL,
                Audit.WAIT_PARKED,
                "the wait is open, no cancel pending; the lease is released and the attempt's token spent",
            ),
            fenced=True,
            describe="park on a wait",
        ),
        _t(
            Action.COMPLETE_WAIT,
            CANCELLABLE,
            Outcome(S.PENDING, Audit.WAIT_COMPLETED, "parked on this open wait (no lease); the first outcome wins"),
            Outcome(None, Audit.WAIT_ENDED, "not parked on it: the wait ends, the run's handler finds the outcome"),
            fenced=False,
            describe="complete a wait of",
        ),
        _t(
            Action.EXPIRE_WAIT,
            CANCELLABLE,
            Outcome(S.PENDING, Audit.WAIT_TIMED_OUT, "parked on an open wait timed out (or expired by hand)"),
            Outcome(None, Audit.WAIT_ENDED, "not parked on it: the wait ends timed out, the run stays"),
            fenced=False,
            describe="time out a wait of",
        ),
        _t(
            Action.HOLD,
            LEASED,
            Outcome(
                S.PENDING,
                Audit.HELD,
                "no cancel pending; parked (not_before 'infinity', wait_reason held) until an operator's"
                " UnholdRun; the attempt is not spent",
            ),
            Outcome(S.CANCELLED, Audit.CANCELLED, "a cancel is pending"),
            fenced=True,
            describe="hold",
            replays_from=[S.PENDING, S.CANCELLED],
        ),
        _t(
            Action.UNHOLD,
            [S.PENDING],
            Outcome(S.PENDING, Audit.UNHELD, "held by HoldRun: claimable at once (not_before and wait_reason cleared)"),
            fenced=False,
            describe="unhold",
        ),
        _t(
            Action.SET_BUILD,
            [S.PENDING, S.RESUMED, S.WAITING_APPROVAL],
            Outcome(None, Audit.BUILD_SET, "no worker holds it: it resumes on the build given"),
            fenced=False,
            describe="move to another build",
        ),
    )
}


class Refusal(StrEnum):
    """Why a fenced write changed nothing (the error reason it answers)."""

    LEASE_LOST = errors.LEASE_LOST
    INVALID_TRANSITION = errors.INVALID_TRANSITION


def fenced_refusal(status: str, token_is_current: bool, lease_was_reaped: bool) -> Refusal:
    """The error of a fenced write that changed nothing: LEASE_LOST when the token does not
    name the run's live lease (another attempt, or the lease was taken back: reaped, released,
    retried, approved), INVALID_TRANSITION when it does but the action is not allowed from
    the run's status."""
    if not token_is_current or status in CLAIMABLE:
        return Refusal.LEASE_LOST
    if status in TERMINAL and lease_was_reaped:
        return Refusal.LEASE_LOST
    return Refusal.INVALID_TRANSITION
