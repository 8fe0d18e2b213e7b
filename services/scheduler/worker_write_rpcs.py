"""The fenced worker writes (CompleteRun, CompleteRuns, FailRun, ReleaseRun, HoldRun, WaitTool,
ResumeTool, AcknowledgeCancel): validate the lease and the fields, call transitions / batch_complete, build
the answer. ClaimRuns' carried completions are validated and answered by the same two helpers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from awooop.scheduler.v1 import scheduler_pb2
from services.common import errors, retry_policy
from services.common.auth import current_principal
from services.common.limits import MAX_ERROR_CODE, MAX_ID, MAX_TEXT
from services.common.runs import run_to_pb
from services.common.settings import Settings
from services.common.validate import Violations
from services.scheduler import batch_complete, budget, transitions
from services.scheduler.rpc_fields import lease
from services.scheduler.saga_client import SagaNudger

MAX_COMPLETE_RUNS = 1000
MAX_RETRY_AFTER = 86400.0


def complete_items(
    v: Violations,
    field: str,
    runs: Sequence[scheduler_pb2.CompleteRunRequest],
    *,
    required: bool,
    max_payload_bytes: int,
) -> list[batch_complete.Item]:
    """The items of CompleteRuns.runs / ClaimRuns.complete, validated."""
    if not runs and required:
        v.add(field, "at least one run is required")
    elif len(runs) > MAX_COMPLETE_RUNS:
        v.add(field, f"at most {MAX_COMPLETE_RUNS} runs per call")
    items = []
    for i, item in enumerate(runs[:MAX_COMPLETE_RUNS]):
        run_id, attempt = lease(v, f"{field}[{i}].lease", item.lease)
        _, output = v.json(f"{field}[{i}].output", item.output, max_bytes=max_payload_bytes)
        items.append(batch_complete.Item(run_id, attempt, output))
    return items


def complete_results(
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


class WorkerWriteRpcs:
    def __init__(self, pool: asyncpg.Pool, settings: Settings, saga: SagaNudger) -> None:
        self.pool = pool
        self.settings = settings
        self.saga = saga
        self._budget = budget.answer_budget(settings.max_message_bytes)
        self._policy_defaults = json.dumps(retry_policy.defaults(settings))

    async def _fenced(self, op: transitions.FencedOp, run_id: str, attempt: int, **params: Any) -> transitions.Changed:
        return await transitions.fenced_write(
            self.pool, op, current_principal(), run_id, attempt, saga=self.saga, **params
        )

    async def complete_run(self, request: scheduler_pb2.CompleteRunRequest) -> scheduler_pb2.CompleteRunResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
        output = v.struct("output", request.output, max_bytes=self.settings.max_payload_bytes)
        v.raise_if_any()
        changed = await self._fenced(transitions.COMPLETE, run_id, attempt, output=output)
        return scheduler_pb2.CompleteRunResponse(run=run_to_pb(changed.row))

    async def complete_runs(self, request: scheduler_pb2.CompleteRunsRequest) -> scheduler_pb2.CompleteRunsResponse:
        v = Violations()
        items = complete_items(
            v, "runs", request.runs, required=True, max_payload_bytes=self.settings.max_payload_bytes
        )
        v.raise_if_any()
        outcomes = await batch_complete.complete_many(self.pool, current_principal(), items, saga=self.saga)
        results = complete_results(outcomes)
        budget.trim_results(results, self._budget)
        return scheduler_pb2.CompleteRunsResponse(results=results)

    async def fail_run(self, request: scheduler_pb2.FailRunRequest) -> scheduler_pb2.FailRunResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
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

    async def release_run(self, request: scheduler_pb2.ReleaseRunRequest) -> scheduler_pb2.ReleaseRunResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        v.raise_if_any()
        changed = await self._fenced(transitions.RELEASE, run_id, attempt, reason=reason)
        return scheduler_pb2.ReleaseRunResponse(run=run_to_pb(changed.row))

    async def hold_run(self, request: scheduler_pb2.HoldRunRequest) -> scheduler_pb2.HoldRunResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        error_code = v.token("error_code", request.error_code, max_len=MAX_ERROR_CODE, required=False)
        v.raise_if_any()
        changed = await self._fenced(
            transitions.HOLD, run_id, attempt, reason=reason or "held by its worker", error_code=error_code
        )
        return scheduler_pb2.HoldRunResponse(run=run_to_pb(changed.row))

    async def wait_tool(self, request: scheduler_pb2.WaitToolRequest) -> scheduler_pb2.WaitToolResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
        tool_id = v.token("tool_id", request.tool_id, max_len=MAX_ID, required=False)
        v.raise_if_any()
        changed = await self._fenced(transitions.WAIT_TOOL, run_id, attempt, tool_id=tool_id)
        return scheduler_pb2.WaitToolResponse(run=run_to_pb(changed.row))

    async def resume_tool(self, request: scheduler_pb2.ResumeToolRequest) -> scheduler_pb2.ResumeToolResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
        v.raise_if_any()
        changed = await self._fenced(transitions.RESUME_TOOL, run_id, attempt)
        return scheduler_pb2.ResumeToolResponse(run=run_to_pb(changed.row))

    async def acknowledge_cancel(
        self, request: scheduler_pb2.AcknowledgeCancelRequest
    ) -> scheduler_pb2.AcknowledgeCancelResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
        v.raise_if_any()
        changed = await self._fenced(transitions.ACKNOWLEDGE_CANCEL, run_id, attempt)
        return scheduler_pb2.AcknowledgeCancelResponse(
            run=run_to_pb(changed.row), compensation_requested=changed.compensation_requested
        )
