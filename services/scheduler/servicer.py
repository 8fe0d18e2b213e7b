"""SchedulerService transport: one method per RPC (the names grpc registers), each handing the
request to its group's module, which validates it, calls the logic and builds the response. Every
rule about runs lives in the logic modules (leases, claiming, transitions, approvals, waits, reads,
...); errors are raised as ServiceError and mapped by the interceptor."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.runtime import AppContext
from services.scheduler.approval_rpcs import ApprovalRpcs
from services.scheduler.build_rpcs import BuildRpcs
from services.scheduler.child_rpcs import ChildRpcs
from services.scheduler.claim_rpcs import ClaimRpcs
from services.scheduler.debounce_rpcs import DebounceRpcs
from services.scheduler.flow_rpcs import FlowRpcs
from services.scheduler.read_rpcs import ReadRpcs
from services.scheduler.saga_client import SagaNudger
from services.scheduler.schedule_rpcs import ScheduleRpcs
from services.scheduler.wait_rpcs import WaitRpcs
from services.scheduler.wakeup import RunReadyListener
from services.scheduler.watch_rpcs import WatchRpcs
from services.scheduler.worker_write_rpcs import WorkerWriteRpcs


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, ctx: AppContext, listener: RunReadyListener, saga: SagaNudger) -> None:
        pool, settings = ctx.pool, ctx.settings
        self.claims = ClaimRpcs(ctx, listener, saga)
        self.writes = WorkerWriteRpcs(pool, settings, saga)
        self.approvals = ApprovalRpcs(pool, settings, saga)
        self.waits = WaitRpcs(pool, settings)
        self.children = ChildRpcs(pool, settings)
        self.reads = ReadRpcs(pool, settings)
        self.flow = FlowRpcs(pool, settings)
        self.builds = BuildRpcs(pool, settings)
        self.schedules = ScheduleRpcs(pool, settings)
        self.debounce = DebounceRpcs(pool)
        self.watch = WatchRpcs(pool, settings, listener, ctx.cache)

    # --- claims and leases (claim_rpcs.py) ----------------------------------------------------------

    async def ClaimRuns(
        self, request: scheduler_pb2.ClaimRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ClaimRunsResponse:
        return await self.claims.claim_runs(request, context)

    async def Heartbeat(
        self, request: scheduler_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.HeartbeatResponse:
        return await self.claims.heartbeat(request)

    # --- fenced worker writes (worker_write_rpcs.py) ------------------------------------------------

    async def CompleteRun(
        self, request: scheduler_pb2.CompleteRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CompleteRunResponse:
        return await self.writes.complete_run(request)

    async def CompleteRuns(
        self, request: scheduler_pb2.CompleteRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CompleteRunsResponse:
        return await self.writes.complete_runs(request)

    async def FailRun(
        self, request: scheduler_pb2.FailRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.FailRunResponse:
        return await self.writes.fail_run(request)

    async def ReleaseRun(
        self, request: scheduler_pb2.ReleaseRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ReleaseRunResponse:
        return await self.writes.release_run(request)

    async def HoldRun(
        self, request: scheduler_pb2.HoldRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.HoldRunResponse:
        return await self.writes.hold_run(request)

    async def WaitTool(
        self, request: scheduler_pb2.WaitToolRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.WaitToolResponse:
        return await self.writes.wait_tool(request)

    async def ResumeTool(
        self, request: scheduler_pb2.ResumeToolRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ResumeToolResponse:
        return await self.writes.resume_tool(request)

    async def UnholdRun(
        self, request: scheduler_pb2.UnholdRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.UnholdRunResponse:
        return await self.approvals.unhold_run(request)

    # --- worker builds (build_rpcs.py) ---------------------------------------------------------------

    async def SetRunBuild(
        self, request: scheduler_pb2.SetRunBuildRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.SetRunBuildResponse:
        return await self.builds.set_run_build(request)

    async def ListBuilds(
        self, request: scheduler_pb2.ListBuildsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListBuildsResponse:
        return await self.builds.list_builds(request)

    async def ListWorkers(
        self, request: scheduler_pb2.ListWorkersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListWorkersResponse:
        return await self.builds.list_workers(request)

    async def ListPatches(
        self, request: scheduler_pb2.ListPatchesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListPatchesResponse:
        return await self.builds.list_patches(request)

    async def DrainBuild(
        self, request: scheduler_pb2.DrainBuildRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.DrainBuildResponse:
        return await self.builds.drain_build(request)

    async def AcknowledgeCancel(
        self, request: scheduler_pb2.AcknowledgeCancelRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.AcknowledgeCancelResponse:
        return await self.writes.acknowledge_cancel(request)

    # --- approvals and cancel (approval_rpcs.py) ----------------------------------------------------

    async def RequestApproval(
        self, request: scheduler_pb2.RequestApprovalRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.RequestApprovalResponse:
        return await self.approvals.request_approval(request)

    async def DecideApproval(
        self, request: scheduler_pb2.DecideApprovalRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.DecideApprovalResponse:
        return await self.approvals.decide_approval(request)

    async def CancelRun(
        self, request: scheduler_pb2.CancelRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CancelRunResponse:
        return await self.approvals.cancel_run(request)

    # --- durable waits (wait_rpcs.py) ---------------------------------------------------------------

    async def CreateWait(
        self, request: scheduler_pb2.CreateWaitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CreateWaitResponse:
        return await self.waits.create_wait(request)

    async def AwaitWait(
        self, request: scheduler_pb2.AwaitWaitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.AwaitWaitResponse:
        return await self.waits.await_wait(request)

    async def CompleteWait(
        self, request: scheduler_pb2.CompleteWaitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CompleteWaitResponse:
        return await self.waits.complete_wait(request)

    async def ExpireWait(
        self, request: scheduler_pb2.ExpireWaitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ExpireWaitResponse:
        return await self.waits.expire_wait(request)

    async def ListWaits(
        self, request: scheduler_pb2.ListWaitsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListWaitsResponse:
        return await self.waits.list_waits(request)

    # --- child runs (child_rpcs.py) -----------------------------------------------------------------

    async def StartChildRuns(
        self, request: scheduler_pb2.StartChildRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.StartChildRunsResponse:
        return await self.children.start_child_runs(request)

    # --- run reads (read_rpcs.py) -------------------------------------------------------------------

    async def GetRun(
        self, request: scheduler_pb2.GetRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.GetRunResponse:
        return await self.reads.get_run(request)

    async def ListRuns(
        self, request: scheduler_pb2.ListRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListRunsResponse:
        return await self.reads.list_runs(request)

    async def CountRuns(
        self, request: scheduler_pb2.CountRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.CountRunsResponse:
        return await self.reads.count_runs(request)

    async def ListProjects(
        self, request: scheduler_pb2.ListProjectsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListProjectsResponse:
        return await self.reads.list_projects(request)

    async def GetRunHistory(
        self, request: scheduler_pb2.GetRunHistoryRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.GetRunHistoryResponse:
        return await self.reads.get_run_history(request)

    # --- project flow: settings, concurrency limits, pause, redrive (flow_rpcs.py) ------------------

    async def GetProjectFlow(
        self, request: scheduler_pb2.GetProjectFlowRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.GetProjectFlowResponse:
        return await self.flow.get_project_flow(request)

    async def SetProjectFlow(
        self, request: scheduler_pb2.SetProjectFlowRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.SetProjectFlowResponse:
        return await self.flow.set_project_flow(request)

    async def SetConcurrencyLimit(
        self, request: scheduler_pb2.SetConcurrencyLimitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.SetConcurrencyLimitResponse:
        return await self.flow.set_concurrency_limit(request)

    async def ListConcurrencyLimits(
        self, request: scheduler_pb2.ListConcurrencyLimitsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListConcurrencyLimitsResponse:
        return await self.flow.list_concurrency_limits(request)

    async def PauseProject(
        self, request: scheduler_pb2.PauseProjectRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.PauseProjectResponse:
        return scheduler_pb2.PauseProjectResponse(flow=await self.flow.pause(request.project_id, request.reason, True))

    async def ResumeProject(
        self, request: scheduler_pb2.ResumeProjectRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ResumeProjectResponse:
        return scheduler_pb2.ResumeProjectResponse(
            flow=await self.flow.pause(request.project_id, request.reason, False)
        )

    async def RedriveRuns(
        self, request: scheduler_pb2.RedriveRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.RedriveRunsResponse:
        return await self.flow.redrive_runs(request)

    # --- schedules (schedule_rpcs.py) ---------------------------------------------------------------

    async def SetSchedule(
        self, request: scheduler_pb2.SetScheduleRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.SetScheduleResponse:
        return await self.schedules.set_schedule(request)

    async def ListSchedules(
        self, request: scheduler_pb2.ListSchedulesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListSchedulesResponse:
        return await self.schedules.list_schedules(request)

    async def DeleteSchedule(
        self, request: scheduler_pb2.DeleteScheduleRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.DeleteScheduleResponse:
        return await self.schedules.delete_schedule(request)

    # --- debounce rules (debounce_rpcs.py) -----------------------------------------------------------

    async def SetDebounceRule(
        self, request: scheduler_pb2.SetDebounceRuleRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.SetDebounceRuleResponse:
        return await self.debounce.set_rule(request)

    async def ListDebounceRules(
        self, request: scheduler_pb2.ListDebounceRulesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.ListDebounceRulesResponse:
        return await self.debounce.list_rules(request)

    async def DeleteDebounceRule(
        self, request: scheduler_pb2.DeleteDebounceRuleRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.DeleteDebounceRuleResponse:
        return await self.debounce.delete_rule(request)

    # --- watching runs (watch_rpcs.py) --------------------------------------------------------------

    async def EmitEvent(
        self, request: scheduler_pb2.EmitEventRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.EmitEventResponse:
        return await self.watch.emit_event(request)

    async def WatchRun(
        self, request: scheduler_pb2.WatchRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[scheduler_pb2.WatchRunResponse]:
        async for answer in self.watch.watch_run(request, context):
            yield answer

    async def PublishTokens(
        self, request: scheduler_pb2.PublishTokensRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> scheduler_pb2.PublishTokensResponse:
        return await self.watch.publish_tokens(request)
