"""RequestApproval, DecideApproval, CancelRun and UnholdRun: validate, call approvals / transitions, build
the answer (and the decision's span in the run's trace)."""

from __future__ import annotations

import asyncpg

from awooop.scheduler.v1 import scheduler_pb2
from services.common import tracing
from services.common.auth import current_principal
from services.common.limits import MAX_ID, MAX_TEXT
from services.common.runs import run_to_pb, ts
from services.common.settings import Settings
from services.common.validate import Violations
from services.scheduler import approvals, transitions
from services.scheduler.rpc_fields import lease
from services.scheduler.saga_client import SagaNudger

MAX_APPROVAL_TTL = 7 * 86400.0
MAX_APPROVAL_TOKEN = 256


class ApprovalRpcs:
    def __init__(self, pool: asyncpg.Pool, settings: Settings, saga: SagaNudger) -> None:
        self.pool = pool
        self.settings = settings
        self.saga = saga

    async def request_approval(
        self, request: scheduler_pb2.RequestApprovalRequest
    ) -> scheduler_pb2.RequestApprovalResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
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

    async def decide_approval(
        self, request: scheduler_pb2.DecideApprovalRequest
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

    async def cancel_run(self, request: scheduler_pb2.CancelRunRequest) -> scheduler_pb2.CancelRunResponse:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        v.raise_if_any()
        changed = await transitions.cancel(self.pool, current_principal(), run_id, reason, saga=self.saga)
        return scheduler_pb2.CancelRunResponse(
            run=run_to_pb(changed.row), compensation_requested=changed.compensation_requested
        )

    async def unhold_run(self, request: scheduler_pb2.UnholdRunRequest) -> scheduler_pb2.UnholdRunResponse:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        build_id = v.token("build_id", request.build_id, max_len=MAX_ID, required=False)
        v.raise_if_any()
        changed = await transitions.unhold(self.pool, current_principal(), run_id, reason, build_id or None)
        return scheduler_pb2.UnholdRunResponse(run=run_to_pb(changed.row))
