"""ClaimRuns and Heartbeat: validate, call the claim (claiming, batch_complete, hand_back) or the
lease renewal (leases), build the answer."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from services.common import errors, labels
from services.common.access import projects_with, require_role
from services.common.auth import Principal, current_principal
from services.common.db import Row
from services.common.limits import MAX_ID
from services.common.runs import run_to_pb, set_run_tree, set_time, ts
from services.common.runtime import AppContext
from services.common.validate import Violations
from services.scheduler import (
    batch_complete,
    budget,
    builds,
    claim_answers,
    claiming,
    hand_back,
    leases,
    metrics,
    workers,
)
from services.scheduler.rpc_fields import lease
from services.scheduler.saga_client import SagaNudger
from services.scheduler.wakeup import RunReadyListener
from services.scheduler.worker_write_rpcs import complete_items, complete_results

MAX_CLAIM_RUNS = 100
MAX_CLAIM_PROJECTS = 100
MAX_HEARTBEAT_LEASES = 1000
MAX_LEASE_TTL = 3600.0  # seconds


def _claimed(rows: Sequence[Row]) -> list[scheduler_pb2.ClaimedRun]:
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


def _deadline_passed(context: grpc.aio.ServicerContext[Any, Any]) -> Callable[[], bool]:
    """Whether the call's deadline has passed (an answer now would not arrive). A call that the
    client cancels or whose connection closes is seen as the handler's cancellation instead:
    grpc.aio's context.cancelled() and done() only reflect what the server itself answered."""

    def passed() -> bool:
        remaining = context.time_remaining()
        return remaining is not None and remaining <= 0

    return passed


@dataclass(frozen=True)
class _ClaimCall:
    """A validated ClaimRuns request, with its caller."""

    principal: Principal
    worker_id: str
    projects: list[str]
    max_runs: int
    wait: float
    lease_ttl: float
    items: list[batch_complete.Item]
    key: claim_answers.ClaimKey | None
    gone: Callable[[], bool]
    routing: workers.Routing  # the worker's build ('' none) and labels, as the claim routes by them


class ClaimRpcs:
    def __init__(self, ctx: AppContext, listener: RunReadyListener, saga: SagaNudger) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.pool = ctx.pool
        self.listener = listener
        self.saga = saga
        self._budget = budget.answer_budget(ctx.settings.max_message_bytes)
        self.builds = builds.BuildRegistry(ctx.pool, ctx.settings.build_live_seconds)
        self.workers = workers.WorkerRegistry(ctx.pool, ctx.settings.worker_live_seconds)

    def _lease_ttl(self, v: Violations, value: Duration) -> float:
        return v.duration("lease_ttl", value, max_seconds=MAX_LEASE_TTL, default=self.settings.lease_ttl)

    async def claim_runs(
        self, request: scheduler_pb2.ClaimRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ClaimRunsResponse:
        call = self._claim_call(request, context)
        if call.routing.build_id:
            await self.builds.seen(call.projects, call.routing.build_id)
        self.workers.seen(call.projects, call.worker_id, call.routing)
        if call.items:  # complete, then claim, in one statement; never waits (see the proto)
            return await self._complete_and_claim(call)
        wait = min(max(call.wait, 0.0), self.settings.max_claim_wait)
        remaining = context.time_remaining()
        if remaining is not None:  # answer (empty) before the caller's deadline, not DEADLINE_EXCEEDED
            wait = max(0.0, min(wait, remaining - min(1.0, remaining * 0.2)))
        claim = await claiming.claim_runs(
            self.pool,
            self.listener,
            projects=call.projects,
            max_runs=call.max_runs,
            lease_ttl=call.lease_ttl,
            worker_id=call.worker_id,
            actor=call.principal.actor,
            wait=wait,
            gone=call.gone,
            key=call.key,
            routing=call.routing,
        )
        if not claim.rows and not claim.replayed and wait > 0 and self.ctx.stopping.is_set():
            # an empty answer now would bring the worker straight back here (a claim storm while
            # this replica drains); UNAVAILABLE makes its channel retry on another replica
            raise errors.shutting_down("this scheduler is shutting down; claim from another replica")
        return scheduler_pb2.ClaimRunsResponse(
            runs=await self._deliverable(claim, self._budget, call.worker_id, call.principal.actor, call.gone)
        )

    def _claim_call(
        self, request: scheduler_pb2.ClaimRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> _ClaimCall:
        """The request validated and the caller's worker role checked in every project."""
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
        items = complete_items(
            v, "complete", request.complete, required=False, max_payload_bytes=self.settings.max_payload_bytes
        )
        claim_id = v.token("claim_id", request.claim_id, max_len=MAX_ID, required=False)
        build_id = v.token("build_id", request.build_id, max_len=MAX_ID, required=False)
        worker_labels = labels.parse(v, "labels", request.labels)
        v.raise_if_any()
        principal = current_principal()
        for p in projects:
            require_role(principal, p, "worker")
        key = None
        if claim_id:
            key = claim_answers.ClaimKey(
                principal.actor, worker_id, claim_id, tuple(sorted(projects)), max_runs, lease_ttl
            )
        return _ClaimCall(
            principal,
            worker_id,
            projects,
            max_runs,
            wait,
            lease_ttl,
            items,
            key,
            _deadline_passed(context),
            workers.routing(self.settings, build_id, worker_labels),
        )

    async def _complete_and_claim(self, call: _ClaimCall) -> scheduler_pb2.ClaimRunsResponse:
        outcomes, claim = await hand_back.to_the_end(
            self.pool,
            lambda: batch_complete.complete_and_claim(
                self.pool,
                call.principal,
                call.items,
                projects=call.projects,
                max_runs=call.max_runs,
                lease_ttl=call.lease_ttl,
                worker_id=call.worker_id,
                saga=self.saga,
                key=call.key,
                routing=call.routing,
            ),
            lambda done: done[1].taken,
            call.worker_id,
            call.principal.actor,
        )
        completed = complete_results(outcomes)
        left = self._budget - budget.trim_results(completed, self._budget)
        runs = await self._deliverable(claim, left, call.worker_id, call.principal.actor, call.gone)
        return scheduler_pb2.ClaimRunsResponse(runs=runs, completed=completed)

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

    async def heartbeat(self, request: scheduler_pb2.HeartbeatRequest) -> scheduler_pb2.HeartbeatResponse:
        v = Violations()
        worker_id = v.token("worker_id", request.worker_id, max_len=MAX_ID)
        if not request.leases:
            v.add("leases", "at least one lease is required")
        elif len(request.leases) > MAX_HEARTBEAT_LEASES:
            v.add("leases", f"at most {MAX_HEARTBEAT_LEASES} leases per call")
        lease_list = [lease(v, f"leases[{i}]", token) for i, token in enumerate(request.leases[:MAX_HEARTBEAT_LEASES])]
        lease_ttl = self._lease_ttl(v, request.lease_ttl)
        v.raise_if_any()
        # leases of projects where the caller is no worker are simply not renewed (LEASE_LOST):
        # the answer does not reveal whether such a run exists
        projects = projects_with(current_principal(), "worker")
        renewals = await leases.heartbeat(self.pool, worker_id, lease_list, lease_ttl, projects)
        if any(r.lease_until is not None for r in renewals):
            self.workers.beat(worker_id)  # busy with long runs, it claims nothing: still live
        out = []
        stamps: dict[Any, Any] = {}  # one statement renews every lease to the same instant: convert it once
        for token, r in zip(request.leases, renewals, strict=True):
            if r.lease_until is None:
                item = scheduler_pb2.LeaseRenewal(
                    lease=token, cancel_requested=r.cancel_requested, outcome=scheduler_pb2.LEASE_OUTCOME_LEASE_LOST
                )
            else:
                stamp = stamps.get(r.lease_until)
                if stamp is None:
                    stamp = stamps[r.lease_until] = ts(r.lease_until)
                item = scheduler_pb2.LeaseRenewal(
                    lease=token,
                    cancel_requested=r.cancel_requested,
                    outcome=scheduler_pb2.LEASE_OUTCOME_RENEWED,
                    lease_until=stamp,
                )
            out.append(item)
        lost = sum(1 for r in renewals if r.lease_until is None)
        if lost:
            metrics.LEASE_LOST.labels("Heartbeat").inc(lost)
        return scheduler_pb2.HeartbeatResponse(renewals=out)
