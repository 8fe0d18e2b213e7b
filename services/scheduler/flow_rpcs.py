"""A project's flow settings (GetProjectFlow, SetProjectFlow), concurrency limits
(SetConcurrencyLimit, ListConcurrencyLimits), PauseProject / ResumeProject and RedriveRuns:
validate, check the caller's role, call project_flow / concurrency / redrive, build the answer."""

from __future__ import annotations

import asyncpg
from google.protobuf.duration_pb2 import Duration

from awooop.scheduler.v1 import scheduler_pb2
from services.common import retry_policy, run_options
from services.common.access import require_member, require_role
from services.common.auth import current_principal
from services.common.limits import MAX_CONCURRENCY_KEY, MAX_ERROR_CODE, MAX_TEXT
from services.common.runs import VERSIONING_PB
from services.common.settings import Settings
from services.common.validate import Violations
from services.scheduler import concurrency, project_flow, redrive


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


class FlowRpcs:
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings

    def _flow_pb(self, flow: project_flow.ProjectFlow) -> scheduler_pb2.ProjectFlow:
        effective = {**retry_policy.defaults(self.settings), **flow.retry_policy}
        return scheduler_pb2.ProjectFlow(
            project_id=flow.project_id,
            retry_policy=retry_policy.to_pb(flow.retry_policy),
            weight=flow.weight,
            effective_retry_policy=retry_policy.to_pb(effective),
            paused=flow.paused,
            versioning=VERSIONING_PB[flow.versioning == project_flow.AUTO_UPGRADE],
            sticky_resume_seconds=flow.sticky_seconds,
        )

    async def get_project_flow(
        self, request: scheduler_pb2.GetProjectFlowRequest
    ) -> scheduler_pb2.GetProjectFlowResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        flow = await project_flow.get(self.pool, project_id)
        return scheduler_pb2.GetProjectFlowResponse(flow=self._flow_pb(flow))

    async def set_project_flow(
        self, request: scheduler_pb2.SetProjectFlowRequest
    ) -> scheduler_pb2.SetProjectFlowResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        policy = retry_policy.from_pb(v, "retry_policy", request.retry_policy)
        weight = v.int_range("weight", request.weight, 1, project_flow.MAX_WEIGHT, default=project_flow.DEFAULT_WEIGHT)
        auto_upgrade = run_options.auto_upgrade(v, "versioning", request.versioning)
        sticky = None
        if request.HasField("sticky_resume_seconds"):
            sticky = v.int_range("sticky_resume_seconds", request.sticky_resume_seconds, 0, project_flow.MAX_STICKY)
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, "admin")
        versioning = None if auto_upgrade is None else project_flow.VERSIONING[auto_upgrade]
        flow = await project_flow.set_flow(self.pool, project_id, policy, weight, principal.actor, versioning, sticky)
        return scheduler_pb2.SetProjectFlowResponse(flow=self._flow_pb(flow))

    async def set_concurrency_limit(
        self, request: scheduler_pb2.SetConcurrencyLimitRequest
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
        return scheduler_pb2.SetConcurrencyLimitResponse(limit=_limit_pb(limit))

    async def list_concurrency_limits(
        self, request: scheduler_pb2.ListConcurrencyLimitsRequest
    ) -> scheduler_pb2.ListConcurrencyLimitsResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        limits = await concurrency.list_limits(self.pool, project_id)
        return scheduler_pb2.ListConcurrencyLimitsResponse(limits=[_limit_pb(x) for x in limits])

    async def pause(self, project: str, reason: str, paused: bool) -> scheduler_pb2.ProjectFlow:
        """PauseProject (paused) and ResumeProject: the project's flow afterwards."""
        v = Violations()
        project_id = v.project_id("project_id", project)
        text = v.text("reason", reason, max_len=MAX_TEXT)
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, "admin")
        flow = await project_flow.set_paused(self.pool, project_id, paused, principal.actor, text)
        return self._flow_pb(flow)

    async def redrive_runs(self, request: scheduler_pb2.RedriveRunsRequest) -> scheduler_pb2.RedriveRunsResponse:
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
