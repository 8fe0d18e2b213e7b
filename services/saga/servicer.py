"""SagaService transport: validate requests, call the journal / compensation logic, build
responses. Authentication and error mapping happen in the shared interceptor."""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.protobuf import struct_pb2

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from services.common import errors
from services.common.auth import current_principal
from services.common.limits import MAX_ID, MAX_TEXT
from services.common.runs import saga_status_to_pb, ts
from services.common.sagastate import Trigger
from services.common.settings import Settings
from services.common.validate import Violations
from services.saga import journal, operator_actions
from services.saga.driver import CompensationDriver
from services.saga.metrics import STEP_WRITES
from services.saga.steps import IRREVERSIBLE_TOOLS, step_to_pb, step_type_from_pb

ACTIONS = {
    "execute": saga_pb2.STEP_ACTION_EXECUTE,
    "skip": saga_pb2.STEP_ACTION_SKIP,
    "retry": saga_pb2.STEP_ACTION_RETRY,
}
# step types RecordStep takes: no side effect that a pending record would have to protect
RECORDABLE = (common_pb2.STEP_TYPE_LLM_CALL, common_pb2.STEP_TYPE_CALLBACK)


def idempotency_key(run_id: str, step_id: str) -> str:
    return f"{run_id}:{step_id}"


class SagaServicer(saga_pb2_grpc.SagaServiceServicer):
    def __init__(self, settings: Settings, pool: Any, driver: CompensationDriver) -> None:
        self.settings = settings
        self.pool = pool
        self.driver = driver

    # ---------------------------------------------------------------- validation

    def _lease(self, v: Violations, lease: common_pb2.LeaseToken, present: bool) -> journal.Lease:
        if not present:
            v.add("lease", "required")
            return journal.Lease("", 0)
        run_id = v.uuid("lease.run_id", lease.run_id)
        if lease.attempt < 1:
            v.add("lease.attempt", "must be at least 1 (the attempt_count of your claim)")
        return journal.Lease(run_id, lease.attempt)

    def _struct(self, v: Violations, field: str, value: struct_pb2.Struct) -> dict[str, Any]:
        # large results belong elsewhere (keep a reference): the journal holds the cap
        return v.struct(field, value, max_bytes=self.settings.max_step_result_bytes)

    # ---------------------------------------------------------------- journal

    async def BeginStep(self, request: saga_pb2.BeginStepRequest, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        v = Violations()
        lease = self._lease(v, request.lease, request.HasField("lease"))
        step_id = v.token("step_id", request.step_id, max_len=MAX_ID)
        v.enum("step_type", request.step_type, common_pb2.StepType)
        tool_id = v.token("tool_id", request.tool_id, max_len=MAX_ID, required=False) or None
        if request.step_type == common_pb2.STEP_TYPE_TOOL_CALL and not request.tool_id:
            v.add("tool_id", "required for tool_call steps")
        params = self._struct(v, "tool_params", request.tool_params) if request.HasField("tool_params") else None
        v.raise_if_any()
        begun = await journal.begin_step(
            self.pool, current_principal(), lease, step_id, step_type_from_pb(request.step_type), tool_id, params
        )
        STEP_WRITES.labels("begin", begun.action).inc()
        return saga_pb2.BeginStepResponse(
            action=ACTIONS[begun.action],
            step=step_to_pb(begun.step),
            idempotency_key=idempotency_key(lease.run_id, step_id),
        )

    async def CompleteStep(
        self, request: saga_pb2.CompleteStepRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        v = Violations()
        lease = self._lease(v, request.lease, request.HasField("lease"))
        step_id = v.token("step_id", request.step_id, max_len=MAX_ID)
        result = self._struct(v, "result", request.result)
        cmd = None
        if request.HasField("compensation_cmd"):
            c = request.compensation_cmd
            tool = v.token("compensation_cmd.tool_id", c.tool_id, max_len=MAX_ID)
            if tool in IRREVERSIBLE_TOOLS:
                v.add("compensation_cmd.tool_id", f"{tool} is irreversible and cannot undo anything")
            cmd = {
                "tool_id": tool,
                "params": self._struct(v, "compensation_cmd.params", c.params),
                "reason": v.text("compensation_cmd.reason", c.reason, max_len=MAX_TEXT)
                or f"SAGA compensation of step {step_id}",
            }
        v.raise_if_any()
        row = await journal.complete_step(self.pool, current_principal(), lease, step_id, result, cmd)
        STEP_WRITES.labels("complete", "ok").inc()
        return saga_pb2.CompleteStepResponse(step=step_to_pb(row))

    async def RecordStep(self, request: saga_pb2.RecordStepRequest, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        v = Violations()
        lease = self._lease(v, request.lease, request.HasField("lease"))
        step_id = v.token("step_id", request.step_id, max_len=MAX_ID)
        if request.step_type not in RECORDABLE:
            v.add(
                "step_type",
                "must be STEP_TYPE_LLM_CALL or STEP_TYPE_CALLBACK; tool calls and approvals are begun with "
                "BeginStep so that a crash mid-call leaves a pending record",
            )
        error = v.text("error", request.error, max_len=MAX_TEXT) or None
        result = self._struct(v, "result", request.result)
        if error is not None and result:
            v.add("result", "must be empty when error is given (the step is recorded failed)")
        params = self._struct(v, "params", request.params) if request.HasField("params") else None
        v.raise_if_any()
        done = await journal.record_step(
            self.pool,
            current_principal(),
            lease,
            step_id,
            step_type_from_pb(request.step_type),
            None if error is not None else result,
            error,
            params,
        )
        STEP_WRITES.labels("record", "ok" if done.recorded else "already_completed").inc()
        return saga_pb2.RecordStepResponse(step=step_to_pb(done.step), recorded=done.recorded)

    async def FailStep(self, request: saga_pb2.FailStepRequest, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        v = Violations()
        lease = self._lease(v, request.lease, request.HasField("lease"))
        step_id = v.token("step_id", request.step_id, max_len=MAX_ID)
        error = v.text("error", request.error, max_len=MAX_TEXT, required=True)
        v.raise_if_any()
        row = await journal.fail_step(self.pool, current_principal(), lease, step_id, error)
        STEP_WRITES.labels("fail", "ok").inc()
        return saga_pb2.FailStepResponse(step=step_to_pb(row))

    async def GetJournal(self, request: saga_pb2.GetJournalRequest, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        v.raise_if_any()
        j = await journal.get_journal(self.pool, current_principal(), run_id)
        resp = saga_pb2.GetJournalResponse(
            run_id=run_id,
            saga_status=saga_status_to_pb(j.run["saga_status"]),
            steps=[step_to_pb(s) for s in j.steps],
            saga_steps_json=json.dumps(j.seed_steps, separators=(",", ":"), ensure_ascii=False),
        )
        for field, t in (
            (resp.compensation_started_at, ts(j.run["compensation_started_at"])),
            (resp.compensation_completed_at, ts(j.run["compensation_completed_at"])),
        ):
            if t is not None:
                field.CopyFrom(t)
        if resp.ByteSize() > self.settings.max_message_bytes - 1024:
            raise errors.ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                errors.JOURNAL_TOO_LARGE,
                f"the journal of run {run_id} is larger than AWOOOP_MAX_MESSAGE_BYTES; read awooop_saga_step directly",
                metadata={"run_id": run_id, "bytes": str(resp.ByteSize())},
            )
        return resp

    # ---------------------------------------------------------------- compensation

    async def Compensate(self, request: saga_pb2.CompensateRequest, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        v.enum("trigger", request.trigger, saga_pb2.CompensationTrigger)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        v.raise_if_any()
        trigger = Trigger(
            saga_pb2.CompensationTrigger.Name(request.trigger).removeprefix("COMPENSATION_TRIGGER_").lower()
        )
        done = await operator_actions.request(self.pool, current_principal(), run_id, trigger, reason)
        self.driver.kick()
        return saga_pb2.CompensateResponse(
            saga_status=saga_status_to_pb(done.saga_status),
            steps=[step_to_pb(s) for s in done.steps],
        )

    async def RetryCompensation(
        self, request: saga_pb2.RetryCompensationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        step_id = v.token("step_id", request.step_id, max_len=MAX_ID, required=False)
        v.raise_if_any()
        status = await operator_actions.retry(self.pool, current_principal(), run_id, step_id)
        self.driver.kick()
        return saga_pb2.RetryCompensationResponse(saga_status=saga_status_to_pb(status))

    async def ResolveCompensation(
        self, request: saga_pb2.ResolveCompensationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        step_id = v.token("step_id", request.step_id, max_len=MAX_ID)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT, required=True)
        if reason and not reason.strip():
            v.add("reason", "must not be blank")
        v.raise_if_any()
        done = await operator_actions.resolve(self.pool, current_principal(), run_id, step_id, reason)
        return saga_pb2.ResolveCompensationResponse(
            step=step_to_pb(done.step),
            saga_status=saga_status_to_pb(done.saga_status),
        )
