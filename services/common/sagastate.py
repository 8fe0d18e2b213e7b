"""The saga's three state machines (seed ADR-119 D1, D4-D6), declared once the way runstate.py
declares the run's: the statuses the store holds, and every transition with the statuses it may
start from, where it may end, who makes it and the audit action it writes.

- SagaStatus: awooop_run_state.saga_status, the compensation of the run as a whole.
- StepStatus: awooop_saga_step.status, one journaled step.
- RequestStatus: awooop_compensation_request.status, one run's compensation request, driven by
  the saga's compensation driver under a lease named as the run lease is (worker_id,
  attempt_count, lease_until; migration 0140).

The statements that make the transitions are named statements in services/saga/*.sql (and, for
the writes the scheduler makes when a run ends, in the scheduler's); they write these values as
literals, and Python code compares with the enums. tests/test_sagastate.py checks every declared
set against the store's CHECK constraints and column defaults, against the protobuf enums, and
every status literal of the saga's statements against the declared sets; tests/test_status_sets.py
requires every list of statuses written out in any .sql file (statements, migrations and the
current schema, services/common/schema.sql) to be one of the sets declared here or in runstate.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar


class SagaStatus(StrEnum):
    """awooop_run_state.saga_status (SAGA_STATUS_<NAME> in protobuf)."""

    IN_PROGRESS = "in_progress"
    NOT_NEEDED = "not_needed"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"


class StepStatus(StrEnum):
    """awooop_saga_step.status (STEP_STATUS_<NAME> in protobuf)."""

    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"
    COMPENSATING = "compensating"  # durable intent: the undo's gateway call is (or was) under way
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    RESOLVED = "resolved"  # an operator closed a failed compensation by hand


class RequestStatus(StrEnum):
    """awooop_compensation_request.status."""

    PENDING = "pending"
    RUNNING = "running"  # held by a driver replica under a lease
    DONE = "done"


class StepType(StrEnum):
    """awooop_saga_step.step_type (STEP_TYPE_<NAME> in protobuf)."""

    LLM_CALL = "llm_call"
    TOOL_CALL = "tool_call"
    APPROVAL_REQUEST = "approval_request"
    CALLBACK = "callback"


class Trigger(StrEnum):
    """awooop_compensation_request.trigger (COMPENSATION_TRIGGER_<NAME> in protobuf)."""

    APPROVAL_REJECTED = "approval_rejected"
    APPROVAL_EXPIRED = "approval_expired"
    STEP_FAILED = "step_failed"
    CANCELLED = "cancelled"
    MANUAL = "manual"
    PARENT_ENDED = "parent_ended"  # a finished child whose parent ended FAILED or CANCELLED


class SagaAudit(StrEnum):
    """awooop_audit_log.action of the saga's transitions."""

    REQUESTED = "SAGA_COMPENSATION_REQUESTED"
    STARTED = "SAGA_COMPENSATION_STARTED"
    STEP_COMPENSATED = "SAGA_STEP_COMPENSATED"
    FAILED = "SAGA_COMPENSATION_FAILED"
    ENDED = "SAGA_COMPENSATION_ENDED"
    SKIPPED = "SAGA_COMPENSATION_SKIPPED"
    RETRY = "SAGA_COMPENSATION_RETRY"
    RESOLVED = "SAGA_COMPENSATION_RESOLVED"


# The value a new row starts in (the column's DEFAULT, or what the first INSERT writes).
SAGA_INITIAL = SagaStatus.IN_PROGRESS
REQUEST_INITIAL = RequestStatus.PENDING

# Steps that have been or will be compensated, as Compensate lists them.
PLANNED: tuple[StepStatus, ...] = (
    StepStatus.COMPLETED,
    StepStatus.COMPENSATING,
    StepStatus.COMPENSATED,
    StepStatus.COMPENSATION_FAILED,
    StepStatus.RESOLVED,
)
# Steps whose effect happened or may have (pending: begun, its outcome never recorded): the
# compensation lists those it does not undo as left in place (driver.sql StepsNotCompensated).
RAN_OR_MAY_HAVE: tuple[StepStatus, ...] = (StepStatus.COMPLETED, StepStatus.PENDING)
# A saga nothing is being undone in and no failed undo of which waits for an operator: the
# retention may delete an ended run in these (services/ingest/retention.sql).
SAGA_SETTLED: tuple[SagaStatus, ...] = (SagaStatus.IN_PROGRESS, SagaStatus.NOT_NEEDED, SagaStatus.COMPENSATED)
# A saga the saga service has finished with: nothing was to be undone, everything was, or an undo
# failed and waits for an operator. A watch that follows the saga (WatchRun until_saga_ends) ends here.
SAGA_ENDED: tuple[SagaStatus, ...] = (
    SagaStatus.NOT_NEEDED,
    SagaStatus.COMPENSATED,
    SagaStatus.COMPENSATION_FAILED,
)

S = TypeVar("S", SagaStatus, StepStatus, RequestStatus)


@dataclass(frozen=True)
class Transition(Generic[S]):
    """One transition: a row in one of `allowed_from` ends in one of `to` (a status may also stay
    where `when` says so)."""

    action: str
    allowed_from: tuple[S, ...]
    to: tuple[S, ...]
    by: str  # who makes it: an RPC, the driver, the scheduler, the store
    when: str  # the condition, for people
    audit: SagaAudit | None = None


def _by_action(*transitions: Transition[S]) -> dict[str, Transition[S]]:
    return {t.action: t for t in transitions}


# --- saga status (awooop_run_state.saga_status) --------------------------------------------


class SagaAction(StrEnum):
    RUN_ENDED = "run_ended"
    START = "start"
    END = "end"
    SKIP = "skip"
    RETRY = "retry"
    RESOLVE = "resolve"


_SG = SagaStatus
SAGA_STATUSES: tuple[SagaStatus, ...] = tuple(SagaStatus)
SAGA_TRANSITIONS: dict[str, Transition[SagaStatus]] = _by_action(
    Transition(
        SagaAction.RUN_ENDED,
        (_SG.IN_PROGRESS,),
        (_SG.NOT_NEEDED,),
        "scheduler, store",
        "the run ends with nothing to undo: COMPLETED (in the completing statement), or FAILED or "
        "CANCELLED without a compensatable step (the trigger of migration 0080)",
    ),
    Transition(
        SagaAction.START,
        (_SG.IN_PROGRESS, _SG.NOT_NEEDED, _SG.COMPENSATED, _SG.COMPENSATION_FAILED),
        (_SG.COMPENSATING,),
        "driver",
        "the driver holds the request and finds steps to undo (compensation_started_at, once)",
        SagaAudit.STARTED,
    ),
    Transition(
        SagaAction.END,
        (_SG.COMPENSATING,),
        (_SG.COMPENSATED, _SG.COMPENSATION_FAILED),
        "driver",
        "no step is left to undo; compensation_failed when one failed (compensation_completed_at)",
        SagaAudit.ENDED,
    ),
    Transition(
        SagaAction.SKIP,
        (_SG.IN_PROGRESS, _SG.NOT_NEEDED),
        (_SG.NOT_NEEDED,),
        "driver",
        "a request for a run with nothing to undo (seed ADR-119 D6) is closed",
        SagaAudit.SKIPPED,
    ),
    Transition(
        SagaAction.RETRY,
        SAGA_STATUSES,
        (_SG.COMPENSATING,),
        "RetryCompensation",
        "a compensation_failed step is re-opened (the steps decide, not the saga status)",
        SagaAudit.RETRY,
    ),
    Transition(
        SagaAction.RESOLVE,
        SAGA_STATUSES,
        (_SG.COMPENSATED,),
        "ResolveCompensation",
        "a compensation_failed step is resolved; compensated when nothing is left failed or to "
        "undo and no driver holds the request, else the status stays",
        SagaAudit.RESOLVED,
    ),
)

# --- step status (awooop_saga_step.status) --------------------------------------------------


class StepAction(StrEnum):
    BEGIN = "begin"
    RECORD = "record"
    COMPLETE = "complete"
    FAIL = "fail"
    DECIDE_APPROVAL = "decide_approval"
    MARK_COMPENSATING = "mark_compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    RETRY_COMPENSATION = "retry_compensation"
    RESOLVE = "resolve"


_ST = StepStatus
STEP_STATUSES: tuple[StepStatus, ...] = tuple(StepStatus)
# A journal write that (re)starts a step by this attempt: BeginStep and RecordStep overwrite a step
# an earlier attempt left in these (or insert a new one); a completed step keeps its first result.
RESTARTABLE: tuple[StepStatus, ...] = (_ST.PENDING, _ST.FAILED)
STEP_TRANSITIONS: dict[str, Transition[StepStatus]] = _by_action(
    Transition(
        StepAction.BEGIN,
        RESTARTABLE,
        (_ST.PENDING,),
        "BeginStep",
        "a new step, or one an attempt left pending or failed, of the same kind",
    ),
    Transition(
        StepAction.RECORD,
        RESTARTABLE,
        (_ST.COMPLETED, _ST.FAILED),
        "RecordStep",
        "an llm_call or callback step that already ran: new, or left pending or failed, of the same kind",
    ),
    Transition(StepAction.COMPLETE, (_ST.PENDING,), (_ST.COMPLETED,), "CompleteStep", "begun by the same attempt"),
    Transition(StepAction.FAIL, (_ST.PENDING,), (_ST.FAILED,), "FailStep", "begun by the same attempt"),
    Transition(
        StepAction.DECIDE_APPROVAL,
        (_ST.PENDING,),
        (_ST.FAILED,),
        "scheduler",
        "the pending approval_request step of a run whose approval is rejected or expires",
    ),
    Transition(
        StepAction.MARK_COMPENSATING,
        (_ST.COMPLETED, _ST.COMPENSATING),
        (_ST.COMPENSATING,),
        "driver",
        "a compensatable step (awooop_step_compensatable, migration 0141), before its gateway call; "
        "compensating again after a crash: the same idempotency key makes the gateway replay",
    ),
    Transition(
        StepAction.COMPENSATED,
        (_ST.COMPENSATING,),
        (_ST.COMPENSATED,),
        "driver",
        "the gateway ran (or replayed) the undo",
        SagaAudit.STEP_COMPENSATED,
    ),
    Transition(
        StepAction.COMPENSATION_FAILED,
        (_ST.COMPENSATING,),
        (_ST.COMPENSATION_FAILED,),
        "driver",
        "the gateway answered an error (after its tries); an alert row is written with it",
        SagaAudit.FAILED,
    ),
    Transition(
        StepAction.RETRY_COMPENSATION,
        (_ST.COMPENSATION_FAILED,),
        (_ST.COMPENSATING,),
        "RetryCompensation",
        "always; the driver calls again with the same key",
        SagaAudit.RETRY,
    ),
    Transition(
        StepAction.RESOLVE,
        (_ST.COMPENSATION_FAILED,),
        (_ST.RESOLVED,),
        "ResolveCompensation",
        "an operator's reason is given",
        SagaAudit.RESOLVED,
    ),
)

# --- compensation request status (awooop_compensation_request.status) -----------------------


class RequestAction(StrEnum):
    REQUEST = "request"
    CLAIM = "claim"
    RELEASE = "release"
    FINISH = "finish"
    REOPEN = "reopen"


_RQ = RequestStatus
REQUEST_STATUSES: tuple[RequestStatus, ...] = tuple(RequestStatus)
REQUEST_TRANSITIONS: dict[str, Transition[RequestStatus]] = _by_action(
    Transition(
        RequestAction.REQUEST,
        (),
        (_RQ.PENDING,),
        "scheduler, Compensate",
        "a FAILED or CANCELLED run with compensatable steps (one request per run; a second changes nothing)",
        SagaAudit.REQUESTED,
    ),
    Transition(
        RequestAction.CLAIM,
        (_RQ.PENDING, _RQ.RUNNING),
        (_RQ.RUNNING,),
        "driver",
        "pending, or running with an expired lease (a crashed replica's); a new lease: worker_id, "
        "attempt_count + 1 (the fencing token), lease_until",
    ),
    Transition(
        RequestAction.RELEASE,
        (_RQ.RUNNING,),
        (_RQ.PENDING,),
        "driver",
        "the gateway refused the saga's key: nothing ran, the request waits for a key it accepts",
    ),
    Transition(
        RequestAction.FINISH,
        (_RQ.RUNNING,),
        (_RQ.DONE,),
        "driver",
        "under its lease, no step is left to undo",
    ),
    Transition(
        RequestAction.REOPEN,
        (_RQ.DONE,),
        (_RQ.PENDING,),
        "RetryCompensation",
        "a done request goes back to pending (a pending or running one is left to its driver, which "
        "reads the steps again before it finishes)",
    ),
)
