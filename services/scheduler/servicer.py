"""SchedulerService transport: validate the request, call the logic, build the response.
Every rule about runs lives in the logic modules (leases, claiming, transitions,
approvals, reaper, reads); errors are raised as ServiceError and mapped by the interceptor."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common import errors, retry_policy, run_options, tracing
from services.common.access import projects_with, require_member, require_role
from services.common.auth import current_principal
from services.common.limits import (
    MAX_ATTEMPTS_LIMIT,
    MAX_CHILDREN_PER_CALL,
    MAX_CONCURRENCY_KEY,
    MAX_CRON,
    MAX_EMIT_KEY,
    MAX_ERROR_CODE,
    MAX_EVENT_KIND,
    MAX_ID,
    MAX_PROVIDER_EVENT_ID,
    MAX_SCHEDULE_NAME,
    MAX_TEXT,
)
from services.common.run_events import EventSource
from services.common.runs import (
    channel_from_pb,
    run_to_pb,
    set_run_tree,
    set_time,
    status_from_pb,
    status_to_pb,
    ts,
)
from services.common.runstate import TERMINAL, RunStatus, WaitKind, WaitStatus
from services.common.runtime import AppContext
from services.common.validate import Violations, to_struct
from services.scheduler import (
    approvals,
    batch_complete,
    budget,
    children,
    claim_answers,
    claiming,
    concurrency,
    hand_back,
    leases,
    metrics,
    overview,
    project_flow,
    reads,
    redrive,
    run_events,
    schedules,
    transitions,
    waits,
)
from services.scheduler.saga_client import SagaNudger
from services.scheduler.wakeup import RunReadyListener

# request limits (the README's error table names them)
MAX_CLAIM_RUNS = 100
MAX_CLAIM_PROJECTS = 100
MAX_HEARTBEAT_LEASES = 1000
MAX_COMPLETE_RUNS = 1000
MAX_LEASE_TTL = 3600.0  # seconds
MAX_RETRY_AFTER = 86400.0
MAX_APPROVAL_TTL = 7 * 86400.0
MAX_APPROVAL_TOKEN = 256
MAX_WAIT_TIMEOUT = 366 * 86400.0
MAX_LOOKBACK = 86400.0  # an event wait's look-back
DEFAULT_LOOKBACK = 300.0
MAX_CHILD_REASON = 512  # a child's failure_reason in StartChildRuns' answer (GetRun has it whole)
MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 50
INT32_MAX = 2**31 - 1


def _lease(v: Violations, field: str, lease: common_pb2.LeaseToken) -> tuple[str, int]:
    run_id = v.uuid(f"{field}.run_id", lease.run_id)
    v.check(1 <= lease.attempt <= INT32_MAX, f"{field}.attempt", "must be >= 1 (the attempt ClaimRuns returned)")
    return run_id, lease.attempt


def _claimed(rows: list[Any]) -> list[scheduler_pb2.ClaimedRun]:
    out = []
    for r in rows:
        run = run_to_pb(r)
        set_run_tree(run, r)  # a child's handler reads its parent from ctx.run
        claimed = scheduler_pb2.ClaimedRun(
            run=run,
            lease=common_pb2.LeaseToken(run_id=run.run_id, attempt=r["attempt_count"]),
            lease_until=run.lease_until,  # converted once, in the Run
            resumed=r["attempt_count"] > 1,
        )
        if r["traceparent"]:
            # the run's trace goes to the worker, which records the claim's span: no span per
            # claimed run here (recording and exporting one is a visible share of a busy
            # scheduler's CPU). The claim is the run's last change (updated_at, store clock);
            # a replayed claim (claim_wait NULL) no longer knows the queue wait.
            claimed.traceparent = r["traceparent"]
            if r["claim_wait"] is not None:
                set_time(claimed.claimable_since, r["updated_at"] - dt.timedelta(seconds=max(0.0, r["claim_wait"])))
        out.append(claimed)
    return out


def _complete_results(
    outcomes: list[transitions.Changed | errors.ServiceError],
) -> list[scheduler_pb2.CompleteRunResult]:
    """Per-item results of CompleteRuns (and of ClaimRuns.complete), in item order."""
    results = []
    for outcome in outcomes:
        if isinstance(outcome, errors.ServiceError):
            results.append(scheduler_pb2.CompleteRunResult(error_reason=outcome.reason, error_message=outcome.message))
        else:
            results.append(scheduler_pb2.CompleteRunResult(run=run_to_pb(outcome.row)))
    return results


def _deadline_passed(context: grpc.aio.ServicerContext[Any, Any]) -> Callable[[], bool]:
    """Whether the call's deadline has passed (an answer now would not arrive). A call that the
    client cancels or whose connection closes is seen as the handler's cancellation instead:
    grpc.aio's context.cancelled() and done() only reflect what the server itself answered."""

    def passed() -> bool:
        remaining = context.time_remaining()
        return remaining is not None and remaining <= 0

    return passed


_WAIT_KINDS: dict[str, scheduler_pb2.WaitKind.ValueType] = {
    WaitKind.TOKEN: scheduler_pb2.WAIT_KIND_TOKEN,
    WaitKind.SLEEP: scheduler_pb2.WAIT_KIND_SLEEP,
    WaitKind.EVENT: scheduler_pb2.WAIT_KIND_EVENT,
    WaitKind.CHILDREN: scheduler_pb2.WAIT_KIND_CHILDREN,
}
_WAIT_KIND_NAMES = {v: k for k, v in _WAIT_KINDS.items()}
_WAIT_STATUSES: dict[str, scheduler_pb2.WaitStatus.ValueType] = {
    WaitStatus.OPEN: scheduler_pb2.WAIT_STATUS_OPEN,
    WaitStatus.COMPLETED: scheduler_pb2.WAIT_STATUS_COMPLETED,
    WaitStatus.TIMED_OUT: scheduler_pb2.WAIT_STATUS_TIMED_OUT,
}


def _wait_pb(row: Any, *, run_id: str = "", project_id: str = "", status: str = "") -> scheduler_pb2.Wait:
    """A wait from a row of waits.sql or awooop_end_wait (whose columns differ a little)."""
    keys = row.keys()
    w = scheduler_pb2.Wait(
        wait_id=str(row["wait_id"]),
        run_id=str(row["run_id"]) if "run_id" in keys else run_id,
        project_id=row["project_id"] if "project_id" in keys else project_id,
        step_id=row["step_id"],
        kind=_WAIT_KINDS[row["kind"]],
        status=_WAIT_STATUSES[status or row["status"]],
        completed_by=row["completed_by"] or "",
    )
    set_time(w.expires_at, row["expires_at"])
    if row["completed_at"] is not None:
        set_time(w.completed_at, row["completed_at"])
    if row["result"] is not None:
        w.result.CopyFrom(to_struct(row["result"]))
    return w


_SOURCES: dict[EventSource, scheduler_pb2.RunEventSource.ValueType] = {
    EventSource.STATE: scheduler_pb2.RUN_EVENT_SOURCE_STATE,
    EventSource.STEP: scheduler_pb2.RUN_EVENT_SOURCE_STEP,
    EventSource.PROGRESS: scheduler_pb2.RUN_EVENT_SOURCE_PROGRESS,
}


def _watch_event_pb(row: run_events.LogRow) -> scheduler_pb2.WatchEvent:
    return scheduler_pb2.WatchEvent(
        offset=row.offset,
        source=_SOURCES[row.source],
        kind=row.kind,
        data=to_struct(row.data if isinstance(row.data, dict) else {"value": row.data}),
        attempt=row.attempt,
        at=ts(row.at),
    )


def _status_of(value: str | None) -> int:
    try:
        return status_to_pb(value)
    except ValueError:  # a status string some other writer used; never fail a read on it
        return 0


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, ctx: AppContext, listener: RunReadyListener, saga: SagaNudger) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.pool = ctx.pool
        self.listener = listener
        self.saga = saga
        self._budget = budget.answer_budget(ctx.settings.max_message_bytes)
        self._policy_defaults = json.dumps(retry_policy.defaults(ctx.settings))
        self.watchers = run_events.Watchers(ctx.settings.max_watchers)

    def _lease_ttl(self, v: Violations, value: Duration) -> float:
        return v.duration("lease_ttl", value, max_seconds=MAX_LEASE_TTL, default=self.settings.lease_ttl)

    # --- leases ------------------------------------------------------------------------------

    async def ClaimRuns(
        self, request: scheduler_pb2.ClaimRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ClaimRunsResponse:
        v = Violations()
        worker_id = v.token("worker_id", request.worker_id, max_len=MAX_ID)
        projects = list(dict.fromkeys(request.project_ids))
        if not projects:
            v.add("project_ids", "at least one project is required")
        elif len(projects) > MAX_CLAIM_PROJECTS:
            v.add("project_ids", f"at most {MAX_CLAIM_PROJECTS} projects")
        for i, p in enumerate(projects[:MAX_CLAIM_PROJECTS]):
            v.project_id(f"project_ids[{i}]", p)
        max_runs = v.int_range("max_runs", request.max_runs, 1, MAX_CLAIM_RUNS, default=1)
        wait = request.wait.seconds + request.wait.nanos / 1e9
        v.check(wait >= 0, "wait", "must not be negative")
        lease_ttl = self._lease_ttl(v, request.lease_ttl)
        items = self._complete_items(v, "complete", request.complete, required=False)
        claim_id = v.token("claim_id", request.claim_id, max_len=MAX_ID, required=False)
        v.raise_if_any()
        principal = current_principal()
        for p in projects:
            require_role(principal, p, "worker")
        gone = _deadline_passed(context)
        key = None
        if claim_id:
            key = claim_answers.ClaimKey(
                principal.actor, worker_id, claim_id, tuple(sorted(projects)), max_runs, lease_ttl
            )
        if items:  # complete, then claim, in one statement; never waits (see the proto)
            outcomes, claim = await hand_back.to_the_end(
                self.pool,
                lambda: batch_complete.complete_and_claim(
                    self.pool,
                    principal,
                    items,
                    projects=projects,
                    max_runs=max_runs,
                    lease_ttl=lease_ttl,
                    worker_id=worker_id,
                    saga=self.saga,
                    key=key,
                ),
                lambda done: done[1].taken,
                worker_id,
                principal.actor,
            )
            completed = _complete_results(outcomes)
            left = self._budget - budget.trim_results(completed, self._budget)
            runs = await self._deliverable(claim, left, worker_id, principal.actor, gone)
            return scheduler_pb2.ClaimRunsResponse(runs=runs, completed=completed)
        wait = min(max(wait, 0.0), self.settings.max_claim_wait)
        remaining = context.time_remaining()
        if remaining is not None:  # answer (empty) before the caller's deadline, not DEADLINE_EXCEEDED
            wait = max(0.0, min(wait, remaining - min(1.0, remaining * 0.2)))
        claim = await claiming.claim_runs(
            self.pool,
            self.listener,
            projects=projects,
            max_runs=max_runs,
            lease_ttl=lease_ttl,
            worker_id=worker_id,
            actor=principal.actor,
            wait=wait,
            gone=gone,
            key=key,
        )
        if not claim.rows and not claim.replayed and wait > 0 and self.ctx.stopping.is_set():
            # an empty answer now would bring the worker straight back here (a claim storm while
            # this replica drains); UNAVAILABLE makes its channel retry on another replica
            raise errors.shutting_down("this scheduler is shutting down; claim from another replica")
        return scheduler_pb2.ClaimRunsResponse(
            runs=await self._deliverable(claim, self._budget, worker_id, principal.actor, gone)
        )

    async def _deliverable(
        self, claim: claiming.Claim, room: int, worker_id: str, actor: str, gone: Callable[[], bool]
    ) -> list[scheduler_pb2.ClaimedRun]:
        """The claimed runs that fit the answer (hand_back.deliver hands the others back)."""
        answers = _claimed(claim.rows)
        n = await hand_back.deliver(
            self.pool,
            claim.rows,
            answers,
            replayed=claim.replayed,
            room=room,
            worker_id=worker_id,
            actor=actor,
            gone=gone,
        )
        return answers[:n]

    async def Heartbeat(
        self, request: scheduler_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.HeartbeatResponse:
        v = Violations()
        worker_id = v.token("worker_id", request.worker_id, max_len=MAX_ID)
        if not request.leases:
            v.add("leases", "at least one lease is required")
        elif len(request.leases) > MAX_HEARTBEAT_LEASES:
            v.add("leases", f"at most {MAX_HEARTBEAT_LEASES} leases per call")
        lease_list = [_lease(v, f"leases[{i}]", lease) for i, lease in enumerate(request.leases[:MAX_HEARTBEAT_LEASES])]
        lease_ttl = self._lease_ttl(v, request.lease_ttl)
        v.raise_if_any()
        # leases of projects where the caller is no worker are simply not renewed (LEASE_LOST):
        # the answer does not reveal whether such a run exists
        projects = projects_with(current_principal(), "worker")
        renewals = await leases.heartbeat(self.pool, worker_id, lease_list, lease_ttl, projects)
        out = []
        stamps: dict[Any, Any] = {}  # one statement renews every lease to the same instant: convert it once
        for lease, r in zip(request.leases, renewals, strict=True):
            if r.lease_until is None:
                item = scheduler_pb2.LeaseRenewal(
                    lease=lease, cancel_requested=r.cancel_requested, outcome=scheduler_pb2.LEASE_OUTCOME_LEASE_LOST
                )
            else:
                stamp = stamps.get(r.lease_until)
                if stamp is None:
                    stamp = stamps[r.lease_until] = ts(r.lease_until)
                item = scheduler_pb2.LeaseRenewal(
                    lease=lease,
                    cancel_requested=r.cancel_requested,
                    outcome=scheduler_pb2.LEASE_OUTCOME_RENEWED,
                    lease_until=stamp,
                )
            out.append(item)
        lost = sum(1 for r in renewals if r.lease_until is None)
        if lost:
            metrics.LEASE_LOST.labels("Heartbeat").inc(lost)
        return scheduler_pb2.HeartbeatResponse(renewals=out)

    # --- fenced worker writes ----------------------------------------------------------------

    async def _fenced(self, op: transitions.FencedOp, run_id: str, attempt: int, **params: Any) -> transitions.Changed:
        return await transitions.fenced_write(
            self.pool, op, current_principal(), run_id, attempt, saga=self.saga, **params
        )

    async def CompleteRun(
        self, request: scheduler_pb2.CompleteRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CompleteRunResponse:
        v = Violations()
        run_id, attempt = _lease(v, "lease", request.lease)
        output = v.struct("output", request.output, max_bytes=self.settings.max_payload_bytes)
        v.raise_if_any()
        changed = await self._fenced(transitions.COMPLETE, run_id, attempt, output=output)
        return scheduler_pb2.CompleteRunResponse(run=run_to_pb(changed.row))

    async def CompleteRuns(
        self, request: scheduler_pb2.CompleteRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CompleteRunsResponse:
        v = Violations()
        items = self._complete_items(v, "runs", request.runs, required=True)
        v.raise_if_any()
        outcomes = await batch_complete.complete_many(self.pool, current_principal(), items, saga=self.saga)
        results = _complete_results(outcomes)
        budget.trim_results(results, self._budget)
        return scheduler_pb2.CompleteRunsResponse(results=results)

    def _complete_items(
        self, v: Violations, field: str, runs: Sequence[scheduler_pb2.CompleteRunRequest], *, required: bool
    ) -> list[batch_complete.Item]:
        """The items of CompleteRuns.runs / ClaimRuns.complete, validated."""
        if not runs and required:
            v.add(field, "at least one run is required")
        elif len(runs) > MAX_COMPLETE_RUNS:
            v.add(field, f"at most {MAX_COMPLETE_RUNS} runs per call")
        items = []
        for i, item in enumerate(runs[:MAX_COMPLETE_RUNS]):
            run_id, attempt = _lease(v, f"{field}[{i}].lease", item.lease)
            _, output = v.json(f"{field}[{i}].output", item.output, max_bytes=self.settings.max_payload_bytes)
            items.append(batch_complete.Item(run_id, attempt, output))
        return items

    async def FailRun(
        self, request: scheduler_pb2.FailRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.FailRunResponse:
        v = Violations()
        run_id, attempt = _lease(v, "lease", request.lease)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        error_code = v.token("error_code", request.error_code, max_len=MAX_ERROR_CODE, required=False)
        # 0: the run's retry policy chooses the delay
        retry_after = v.duration("retry_after", request.retry_after, max_seconds=MAX_RETRY_AFTER, default=0.0)
        v.raise_if_any()
        changed = await self._fenced(
            transitions.FAIL,
            run_id,
            attempt,
            reason=reason or "failed",
            error_code=error_code,
            retryable=request.retryable,
            retry_after=retry_after,
            policy=self._policy_defaults,
        )
        return scheduler_pb2.FailRunResponse(
            run=run_to_pb(changed.row), compensation_requested=changed.compensation_requested
        )

    async def ReleaseRun(
        self, request: scheduler_pb2.ReleaseRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ReleaseRunResponse:
        v = Violations()
        run_id, attempt = _lease(v, "lease", request.lease)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        v.raise_if_any()
        changed = await self._fenced(transitions.RELEASE, run_id, attempt, reason=reason)
        return scheduler_pb2.ReleaseRunResponse(run=run_to_pb(changed.row))

    async def WaitTool(
        self, request: scheduler_pb2.WaitToolRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.WaitToolResponse:
        v = Violations()
        run_id, attempt = _lease(v, "lease", request.lease)
        tool_id = v.token("tool_id", request.tool_id, max_len=MAX_ID, required=False)
        v.raise_if_any()
        changed = await self._fenced(transitions.WAIT_TOOL, run_id, attempt, tool_id=tool_id)
        return scheduler_pb2.WaitToolResponse(run=run_to_pb(changed.row))

    async def ResumeTool(
        self, request: scheduler_pb2.ResumeToolRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ResumeToolResponse:
        v = Violations()
        run_id, attempt = _lease(v, "lease", request.lease)
        v.raise_if_any()
        changed = await self._fenced(transitions.RESUME_TOOL, run_id, attempt)
        return scheduler_pb2.ResumeToolResponse(run=run_to_pb(changed.row))

    async def AcknowledgeCancel(
        self, request: scheduler_pb2.AcknowledgeCancelRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.AcknowledgeCancelResponse:
        v = Violations()
        run_id, attempt = _lease(v, "lease", request.lease)
        v.raise_if_any()
        changed = await self._fenced(transitions.ACKNOWLEDGE_CANCEL, run_id, attempt)
        return scheduler_pb2.AcknowledgeCancelResponse(
            run=run_to_pb(changed.row), compensation_requested=changed.compensation_requested
        )

    # --- approvals and cancel ----------------------------------------------------------------

    async def RequestApproval(
        self, request: scheduler_pb2.RequestApprovalRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.RequestApprovalResponse:
        v = Violations()
        run_id, attempt = _lease(v, "lease", request.lease)
        summary = v.text("summary", request.summary, max_len=MAX_TEXT)
        ttl = v.duration("ttl", request.ttl, max_seconds=MAX_APPROVAL_TTL, default=self.settings.approval_ttl)
        v.raise_if_any()
        changed, token = await approvals.request(
            self.pool, current_principal(), run_id, attempt, summary, ttl, saga=self.saga
        )
        return scheduler_pb2.RequestApprovalResponse(
            run=run_to_pb(changed.row),
            approval_token=token,
            expires_at=ts(changed.row["approval_expires_at"]),
        )

    async def DecideApproval(
        self, request: scheduler_pb2.DecideApprovalRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.DecideApprovalResponse:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        token = v.token("approval_token", request.approval_token, max_len=MAX_APPROVAL_TOKEN)
        if not (request.validate_only and request.decision == scheduler_pb2.DECISION_UNSPECIFIED):
            v.enum("decision", request.decision, scheduler_pb2.Decision)  # a check needs none
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        v.raise_if_any()
        if request.validate_only:
            row = await approvals.check(self.pool, current_principal(), run_id, token)
            return scheduler_pb2.DecideApprovalResponse(run=run_to_pb(row))
        changed = await approvals.decide(
            self.pool,
            current_principal(),
            run_id,
            token,
            request.decision == scheduler_pb2.DECISION_APPROVE,
            reason,
            saga=self.saga,
        )
        if tracing.tracer is not None:  # the decision in the run's trace (linked to the approver's call)
            with tracing.span(
                "awooop.run.approval_decided",
                parent=changed.row["traceparent"],
                attributes={
                    "awooop.run_id": run_id,
                    "awooop.approved": request.decision == scheduler_pb2.DECISION_APPROVE,
                    "awooop.compensation_requested": changed.compensation_requested,
                },
                link_current=True,
            ):
                pass
        return scheduler_pb2.DecideApprovalResponse(
            run=run_to_pb(changed.row), compensation_requested=changed.compensation_requested
        )

    async def CancelRun(
        self, request: scheduler_pb2.CancelRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CancelRunResponse:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        v.raise_if_any()
        changed = await transitions.cancel(self.pool, current_principal(), run_id, reason, saga=self.saga)
        return scheduler_pb2.CancelRunResponse(
            run=run_to_pb(changed.row), compensation_requested=changed.compensation_requested
        )

    # --- durable waits (waits.py) -------------------------------------------------------------

    async def CreateWait(
        self, request: scheduler_pb2.CreateWaitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CreateWaitResponse:
        v = Violations()
        run_id, attempt = _lease(v, "lease", request.lease)
        step_id = v.token("step_id", request.step_id, max_len=MAX_ID)
        kind = request.kind or scheduler_pb2.WAIT_KIND_TOKEN
        # a CHILDREN wait is created only with its children (StartChildRuns)
        v.check(kind in _WAIT_KIND_NAMES and kind != scheduler_pb2.WAIT_KIND_CHILDREN, "kind", "TOKEN, SLEEP or EVENT")
        timeout = request.timeout.seconds + request.timeout.nanos / 1e9
        v.check(0 < timeout <= MAX_WAIT_TIMEOUT, "timeout", f"required, between 0 and {MAX_WAIT_TIMEOUT:g} seconds")
        match = None
        if kind == scheduler_pb2.WAIT_KIND_EVENT:
            channel = request.match_channel or common_pb2.CHANNEL_TYPE_API
            v.check(channel in common_pb2.ChannelType.values(), "match_channel", "a known CHANNEL_TYPE")
            key = v.token("correlation_key", request.correlation_key, max_len=MAX_PROVIDER_EVENT_ID)
            lookback = v.duration("lookback", request.lookback, max_seconds=MAX_LOOKBACK, default=DEFAULT_LOOKBACK)
            if channel in common_pb2.ChannelType.values():
                match = waits.EventMatch(channel_from_pb(channel), key, lookback)
        v.raise_if_any()
        created = await waits.create(
            self.pool, current_principal(), run_id, attempt, step_id, _WAIT_KIND_NAMES[kind], timeout, match
        )
        url = waits.callback_url(self.settings.wait_callback_base_url, created.token) if created.token else ""
        return scheduler_pb2.CreateWaitResponse(
            wait=_wait_pb(created.wait), token=created.token, callback_url=url, created=created.created
        )

    async def AwaitWait(
        self, request: scheduler_pb2.AwaitWaitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.AwaitWaitResponse:
        v = Violations()
        run_id, attempt = _lease(v, "lease", request.lease)
        wait_id = v.uuid("wait_id", request.wait_id)
        v.raise_if_any()
        parked, row = await waits.park(self.pool, current_principal(), run_id, attempt, wait_id)
        if parked:
            metrics.TRANSITIONS.labels(RunStatus.WAITING_TOOL).inc()
        return scheduler_pb2.AwaitWaitResponse(
            parked=parked, wait=_wait_pb(row, run_id=run_id, project_id=row["cur_project"], status=row["wait_status"])
        )

    async def CompleteWait(
        self, request: scheduler_pb2.CompleteWaitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CompleteWaitResponse:
        v = Violations()
        wait_id = v.uuid("wait_id", request.wait_id)
        result = v.struct("result", request.result, max_bytes=self.settings.max_step_result_bytes)
        v.raise_if_any()
        row = await waits.complete(self.pool, current_principal(), wait_id, result)
        if row["resumed"]:
            metrics.TRANSITIONS.labels(RunStatus.PENDING).inc()
        return scheduler_pb2.CompleteWaitResponse(
            wait=_wait_pb(row, status=row["wait_status"]), resumed=bool(row["resumed"])
        )

    async def ExpireWait(
        self, request: scheduler_pb2.ExpireWaitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ExpireWaitResponse:
        v = Violations()
        wait_id = v.uuid("wait_id", request.wait_id)
        v.raise_if_any()
        row = await waits.expire_by_hand(self.pool, current_principal(), wait_id)
        if row["resumed"]:
            metrics.TRANSITIONS.labels(RunStatus.PENDING).inc()
        return scheduler_pb2.ExpireWaitResponse(
            wait=_wait_pb(row, status=row["wait_status"]), resumed=bool(row["resumed"])
        )

    async def ListWaits(
        self, request: scheduler_pb2.ListWaitsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListWaitsResponse:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        v.raise_if_any()
        rows = await waits.list_for_run(self.pool, current_principal(), run_id)
        return scheduler_pb2.ListWaitsResponse(waits=[_wait_pb(r) for r in rows])

    # --- reads -------------------------------------------------------------------------------

    async def StartChildRuns(
        self, request: scheduler_pb2.StartChildRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.StartChildRunsResponse:
        v = Violations()
        run_id, attempt = _lease(v, "lease", request.lease)
        n = len(request.children)
        v.check(0 < n <= MAX_CHILDREN_PER_CALL, "children", f"1 to {MAX_CHILDREN_PER_CALL} children per call, got {n}")
        specs: list[children.ChildSpec] = []
        seen: set[str] = set()
        for i, c in enumerate(request.children[:MAX_CHILDREN_PER_CALL]):
            prefix = f"children[{i}]."
            step_id = v.token(prefix + "step_id", c.step_id, max_len=MAX_ID)
            v.check(step_id not in seen, prefix + "step_id", "named twice in this call")
            seen.add(step_id)
            options = run_options.parse(
                v,
                prefix,
                not_before=c.not_before if c.HasField("not_before") else None,
                priority=c.priority,
                policy=None,
                concurrency_keys=c.concurrency_keys,
            )
            v.check(0 <= c.max_attempts <= MAX_ATTEMPTS_LIMIT, prefix + "max_attempts", f"0 to {MAX_ATTEMPTS_LIMIT}")
            value = v.struct(prefix + "input", c.input, max_bytes=self.settings.max_payload_bytes)
            specs.append(
                children.ChildSpec(
                    step_id, value, options.priority, options.not_before, options.concurrency_keys, c.max_attempts
                )
            )
        wait_step_id = v.token("wait_step_id", request.wait_step_id, max_len=MAX_ID, required=False) or None
        timeout = MAX_WAIT_TIMEOUT
        if request.HasField("timeout"):
            timeout = request.timeout.seconds + request.timeout.nanos / 1e9
            v.check(0 < timeout <= MAX_WAIT_TIMEOUT, "timeout", f"between 0 and {MAX_WAIT_TIMEOUT:g} seconds")
        v.raise_if_any()
        rows = await children.start(
            self.pool,
            self.settings,
            current_principal(),
            run_id,
            attempt,
            specs,
            policy_defaults=self._policy_defaults,
            traceparent=tracing.current_traceparent(),
            wait_step_id=wait_step_id,
            fail_fast=request.fail_fast,
            timeout=timeout,
        )
        resp = scheduler_pb2.StartChildRunsResponse()
        for r in rows:
            child = resp.children.add(
                step_id=r["step_id"],
                run_id=str(r["run_id"]),
                status=_status_of(r["status"]),
                # its start only: a thousand children's whole reasons could pass the message limit
                failure_reason=(r["failure_reason"] or "")[:MAX_CHILD_REASON],
                error_code=r["error_code"] or "",
                started=r["started"],
            )
            if r["output"] is not None:
                child.output.CopyFrom(to_struct(r["output"]))
        budget.fit_children(resp.children, budget.answer_budget(self.settings.max_message_bytes))
        first = rows[0]
        if first["wait_id"] is not None:
            resp.wait.CopyFrom(_wait_pb(first, run_id=run_id, project_id="", status=first["wait_status"]))
            resp.wait.step_id = first["wait_step_id"]
        return resp

    async def GetRun(
        self, request: scheduler_pb2.GetRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.GetRunResponse:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        v.raise_if_any()
        row = await reads.get_run(self.pool, current_principal(), run_id)
        run = run_to_pb(row)
        set_run_tree(run, row)
        kids = await children.children_of(self.pool, run_id)
        refs = [
            scheduler_pb2.ChildRunRef(
                run_id=str(k["run_id"]),
                step_id=k["parent_step_id"],
                status=_status_of(k["status"]),  # type: ignore[arg-type]
            )
            for k in kids[: children.MAX_LISTED]
        ]
        fit = budget.fit_refs(refs, budget.answer_budget(self.settings.max_message_bytes) - run.ByteSize())
        more = fit < len(refs) or len(kids) > children.MAX_LISTED
        return scheduler_pb2.GetRunResponse(run=run, children=refs[:fit], more_children=more)

    async def ListRuns(
        self, request: scheduler_pb2.ListRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListRunsResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        statuses = []
        for i, s in enumerate(request.statuses):
            if v.check(s in common_pb2.RunStatus.values() and s != 0, f"statuses[{i}]", "unknown or UNSPECIFIED"):
                statuses.append(status_from_pb(s))
        page_size = v.int_range("page_size", request.page_size, 1, MAX_PAGE_SIZE, default=DEFAULT_PAGE_SIZE)
        channels = []
        for i, c in enumerate(request.channel_types):
            known = c in common_pb2.ChannelType.values() and c != 0
            if v.check(known, f"channel_types[{i}]", "unknown or UNSPECIFIED"):
                channels.append(channel_from_pb(c))
        sagas = []
        for i, g in enumerate(request.saga_statuses):
            if v.check(g in common_pb2.SagaStatus.values() and g != 0, f"saga_statuses[{i}]", "unknown or UNSPECIFIED"):
                sagas.append(common_pb2.SagaStatus.Name(g).removeprefix("SAGA_STATUS_").lower())
        event_id = v.text("provider_event_id", request.provider_event_id, max_len=MAX_PROVIDER_EVENT_ID)
        parent = v.uuid("parent_run_id", request.parent_run_id) if request.parent_run_id else ""
        # (nanos out of range: a violation, not an exception)
        after_time = run_options.timestamp(v, "created_after", request.created_after)
        before_time = run_options.timestamp(v, "created_before", request.created_before)
        after = None
        if request.page_token:
            after = reads.decode_page_token(request.page_token)
            v.check(after is not None, "page_token", "not a token returned by ListRuns")
        v.raise_if_any()
        require_member(current_principal(), project_id)
        where = reads.RunFilter(
            statuses=sorted(set(statuses)) or None,
            channels=sorted(set(channels)) or None,
            created_after=after_time if request.HasField("created_after") else None,
            created_before=before_time if request.HasField("created_before") else None,
            provider_event_id=event_id or None,
            saga_statuses=sorted(set(sagas)) or None,
            parent_run_id=parent or None,
        )
        rows, next_token = await reads.list_runs(self.pool, project_id, where, page_size, after)
        runs = [run_to_pb(r) for r in rows]
        for run, r in zip(runs, rows, strict=True):
            set_run_tree(run, r)
        n = budget.fit_runs(runs, self._budget)
        if n < len(runs):  # the page ends at the last run that fits; the next one starts after it
            runs, next_token = runs[:n], reads.encode_page_token(rows[n - 1]["created_at"], rows[n - 1]["run_id"])
        return scheduler_pb2.ListRunsResponse(runs=runs, next_page_token=next_token)

    async def CountRuns(
        self, request: scheduler_pb2.CountRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CountRunsResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        counts = await overview.count_runs(self.pool, project_id, request.include_finished)
        resp = scheduler_pb2.CountRunsResponse(
            counts=[
                scheduler_pb2.StatusCount(
                    status=status_to_pb(s.value),  # type: ignore[arg-type]  # the enum value as an int
                    count=counts.by_status.get(s.value, 0),
                )
                for s in RunStatus
                if request.include_finished or s not in TERMINAL
            ],
            total=sum(counts.by_status.values()),
            claimable=counts.claimable,
        )
        if counts.oldest_claimable is not None and counts.db_now is not None:
            set_time(resp.oldest_claimable_created_at, counts.oldest_claimable)
            resp.oldest_claimable_age.FromTimedelta(max(counts.db_now - counts.oldest_claimable, dt.timedelta(0)))
        return resp

    async def ListProjects(
        self, request: scheduler_pb2.ListProjectsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListProjectsResponse:
        projects, everything = await overview.list_projects(self.pool, current_principal())
        return scheduler_pb2.ListProjectsResponse(project_ids=projects, all_projects=everything)

    async def GetRunHistory(
        self, request: scheduler_pb2.GetRunHistoryRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.GetRunHistoryResponse:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        v.raise_if_any()
        rows = await reads.history(self.pool, current_principal(), run_id)
        resp = scheduler_pb2.GetRunHistoryResponse(
            events=[
                scheduler_pb2.RunEvent(
                    at=ts(r["created_at"]),
                    action=r["action"],
                    from_status=_status_of(r["from_status"]),  # type: ignore[arg-type]
                    to_status=_status_of(r["to_status"]),  # type: ignore[arg-type]
                    actor=r["actor"],
                    reason=r["reason"] or "",
                    details=to_struct(r["details"] if isinstance(r["details"], dict) else {}),
                )
                for r in rows
            ]
        )
        size = resp.ByteSize()
        if size > self._budget:  # a clear answer, not a transport failure (as GetJournal's JOURNAL_TOO_LARGE)
            raise errors.ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                budget.HISTORY_TOO_LARGE,
                f"the history of run {run_id} is larger than AWOOOP_MAX_MESSAGE_BYTES; read awooop_audit_log directly",
                metadata={"run_id": run_id, "bytes": str(size)},
            )
        return resp

    # --- project flow settings ------------------------------------------------------------------

    def _flow_pb(self, flow: project_flow.ProjectFlow) -> scheduler_pb2.ProjectFlow:
        effective = {**retry_policy.defaults(self.settings), **flow.retry_policy}
        return scheduler_pb2.ProjectFlow(
            project_id=flow.project_id,
            retry_policy=retry_policy.to_pb(flow.retry_policy),
            weight=flow.weight,
            effective_retry_policy=retry_policy.to_pb(effective),
            paused=flow.paused,
        )

    async def GetProjectFlow(
        self, request: scheduler_pb2.GetProjectFlowRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.GetProjectFlowResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        flow = await project_flow.get(self.pool, project_id)
        return scheduler_pb2.GetProjectFlowResponse(flow=self._flow_pb(flow))

    async def SetProjectFlow(
        self, request: scheduler_pb2.SetProjectFlowRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.SetProjectFlowResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        policy = retry_policy.from_pb(v, "retry_policy", request.retry_policy)
        weight = v.int_range("weight", request.weight, 1, project_flow.MAX_WEIGHT, default=project_flow.DEFAULT_WEIGHT)
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, "admin")
        flow = await project_flow.set_flow(self.pool, project_id, policy, weight, principal.actor)
        return scheduler_pb2.SetProjectFlowResponse(flow=self._flow_pb(flow))

    # --- concurrency limits ---------------------------------------------------------------------

    @staticmethod
    def _limit_pb(limit: concurrency.Limit) -> scheduler_pb2.ConcurrencyLimit:
        return scheduler_pb2.ConcurrencyLimit(
            project_id=limit.project_id,
            key=limit.key,
            max_running=limit.max_running,
            running=limit.running,
            waiting=limit.waiting,
            max_starts=limit.max_starts,
            per=Duration(seconds=int(limit.per), nanos=round((limit.per - int(limit.per)) * 1e9)),
        )

    async def SetConcurrencyLimit(
        self, request: scheduler_pb2.SetConcurrencyLimitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.SetConcurrencyLimitResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        key = v.token("key", request.key, max_len=MAX_CONCURRENCY_KEY)
        v.check(0 <= request.max_running <= concurrency.MAX_LIMIT, "max_running", "must be 0 (none) to 100000")
        v.check(0 <= request.max_starts <= 1_000_000, "max_starts", "must be 0 (none) to 1000000")
        per = request.per.seconds + request.per.nanos / 1e9
        if request.max_starts:
            v.check(0.001 <= per <= 86400, "per", "the rate's period: 1 ms to 1 day")
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, "admin")
        limit = await concurrency.set_limit(
            self.pool, project_id, key, request.max_running, principal.actor, max_starts=request.max_starts, per=per
        )
        return scheduler_pb2.SetConcurrencyLimitResponse(limit=self._limit_pb(limit))

    async def ListConcurrencyLimits(
        self, request: scheduler_pb2.ListConcurrencyLimitsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListConcurrencyLimitsResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        limits = await concurrency.list_limits(self.pool, project_id)
        return scheduler_pb2.ListConcurrencyLimitsResponse(limits=[self._limit_pb(x) for x in limits])

    # --- pause, resume, redrive -----------------------------------------------------------------

    async def _pause(self, project: str, reason: str, paused: bool) -> scheduler_pb2.ProjectFlow:
        v = Violations()
        project_id = v.project_id("project_id", project)
        text = v.text("reason", reason, max_len=MAX_TEXT)
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, "admin")
        flow = await project_flow.set_paused(self.pool, project_id, paused, principal.actor, text)
        return self._flow_pb(flow)

    async def PauseProject(
        self, request: scheduler_pb2.PauseProjectRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.PauseProjectResponse:
        return scheduler_pb2.PauseProjectResponse(flow=await self._pause(request.project_id, request.reason, True))

    async def ResumeProject(
        self, request: scheduler_pb2.ResumeProjectRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ResumeProjectResponse:
        return scheduler_pb2.ResumeProjectResponse(flow=await self._pause(request.project_id, request.reason, False))

    async def RedriveRuns(
        self, request: scheduler_pb2.RedriveRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.RedriveRunsResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        error_code = v.token("error_code", request.error_code, max_len=MAX_ERROR_CODE, required=False)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        limit = v.int_range("limit", request.limit, 1, redrive.MAX_LIMIT, default=redrive.DEFAULT_LIMIT)
        after = before = None
        if request.HasField("failed_after"):
            after = run_options.timestamp(v, "failed_after", request.failed_after)
        if request.HasField("failed_before"):
            before = run_options.timestamp(v, "failed_before", request.failed_before)
        if after and before:
            v.check(after < before, "failed_before", "must be later than failed_after")
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, "admin")
        run_ids = await redrive.redrive(
            self.pool,
            project_id,
            error_code=error_code or None,
            failed_after=after,
            failed_before=before,
            limit=limit,
            actor=principal.actor,
            reason=reason,
        )
        return scheduler_pb2.RedriveRunsResponse(redriven=len(run_ids), run_ids=run_ids)

    # --- schedules ---------------------------------------------------------------------------------

    @staticmethod
    def _schedule_pb(s: schedules.Schedule) -> scheduler_pb2.Schedule:
        return scheduler_pb2.Schedule(
            project_id=s.project_id,
            name=s.name,
            cron=s.cron,
            time_zone=s.time_zone,
            input=to_struct(s.input),
            next_tick=ts(s.next_tick),
            last_error=s.last_error or "",
            last_error_at=ts(s.last_error_at),
        )

    async def SetSchedule(
        self, request: scheduler_pb2.SetScheduleRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.SetScheduleResponse:
        v = Violations()
        sched = request.schedule
        project_id = v.project_id("schedule.project_id", sched.project_id)
        name = v.token("schedule.name", sched.name, max_len=MAX_SCHEDULE_NAME)
        cron = v.text("schedule.cron", sched.cron, max_len=MAX_CRON, required=True)
        time_zone = sched.time_zone or "UTC"
        try:
            schedules.zone(time_zone)
        except schedules.ScheduleError as exc:
            v.add("schedule.time_zone", str(exc))
            time_zone = "UTC"  # the cron is still checked, in UTC
        if cron:
            try:
                schedules.check_cron(cron)
                schedules.next_after(cron, time_zone, dt.datetime.now(dt.UTC))  # it fires at least once more
            except schedules.ScheduleError as exc:
                v.add("schedule.cron", str(exc))
        _, input_json = v.json("schedule.input", sched.input, max_bytes=self.settings.max_payload_bytes)
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, "admin")
        try:
            stored = await schedules.set_schedule(
                self.pool, project_id, name, cron, time_zone, input_json, principal.actor
            )
        except schedules.ScheduleError as exc:  # its last tick passed since the check above
            v.add("schedule.cron", str(exc))
            v.raise_if_any()
            raise
        return scheduler_pb2.SetScheduleResponse(schedule=self._schedule_pb(stored))

    async def ListSchedules(
        self, request: scheduler_pb2.ListSchedulesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListSchedulesResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        found = await schedules.list_schedules(self.pool, project_id)
        return scheduler_pb2.ListSchedulesResponse(schedules=[self._schedule_pb(s) for s in found])

    async def DeleteSchedule(
        self, request: scheduler_pb2.DeleteScheduleRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.DeleteScheduleResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        name = v.token("name", request.name, max_len=MAX_SCHEDULE_NAME)
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, "admin")
        deleted = await schedules.delete_schedule(self.pool, project_id, name, principal.actor)
        return scheduler_pb2.DeleteScheduleResponse(deleted=deleted)

    # --- watching runs ----------------------------------------------------------------------------

    async def EmitEvent(
        self, request: scheduler_pb2.EmitEventRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.EmitEventResponse:
        v = Violations()
        run_id, attempt = _lease(v, "lease", request.lease)
        kind = v.text("kind", request.kind, max_len=MAX_EVENT_KIND)
        key = v.token("key", request.key, max_len=MAX_EMIT_KEY, required=False)
        _, data_json = v.json("data", request.data, max_bytes=self.settings.max_run_event_bytes)
        v.raise_if_any()
        bounds = run_events.Bounds(self.settings.max_run_events, self.settings.max_run_event_bytes_total)
        emitted = await run_events.emit(
            self.pool, current_principal(), run_id, attempt, kind, data_json, key or None, bounds
        )
        return scheduler_pb2.EmitEventResponse(offset=emitted.offset, duplicate=emitted.duplicate, count=emitted.count)

    async def WatchRun(
        self, request: scheduler_pb2.WatchRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[scheduler_pb2.WatchRunResponse]:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        v.check(request.after >= 0, "after", "must not be negative (the last offset received; 0: from the start)")
        v.raise_if_any()
        with self.watchers.slot():
            await run_events.open_watch(self.pool, current_principal(), run_id, request.after)
            await context.send_initial_metadata(())  # tells an SSE relay the watch was accepted
            items = run_events.watch(
                self.pool,
                self.listener,
                run_id,
                request.after,
                self.settings.watch_poll_interval,
                snapshot=request.snapshot,
            )
            async for item in items:
                if isinstance(item, run_events.Ended):
                    yield scheduler_pb2.WatchRunResponse(run=run_to_pb(item.run))
                else:
                    yield scheduler_pb2.WatchRunResponse(event=_watch_event_pb(item))
