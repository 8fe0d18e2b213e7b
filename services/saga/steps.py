"""Journal entries: the store's strings <-> protobuf enums, a row of awooop_saga_step ->
common.v1.SagaStep, and JSON values as callers meant them (integral numbers stay integers).

Statuses and step types are stored lower-case, exactly as seed ADR-119 D1 writes them; they are
declared in services/common/sagastate.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

from awooop.common.v1 import common_pb2
from services.common.runs import ts
from services.common.sagastate import StepType
from services.common.validate import to_struct
from services.saga import journal_sql, operator_actions_sql

# Tools whose side effects cannot be undone (seed ADR-119 D3, D6): never carry a compensation command.
IRREVERSIBLE_TOOLS = ("k8s_exec_pod",)


def step_type_from_pb(value: common_pb2.StepType.ValueType) -> StepType:
    return StepType(common_pb2.StepType.Name(value).removeprefix("STEP_TYPE_").lower())


def step_type_to_pb(value: str) -> common_pb2.StepType.ValueType:
    return common_pb2.StepType.Value(f"STEP_TYPE_{value.upper()}")


def step_status_to_pb(value: str) -> common_pb2.StepStatus.ValueType:
    return common_pb2.StepStatus.Value(f"STEP_STATUS_{value.upper()}")


def compensation_to_pb(cmd: Mapping[str, Any]) -> common_pb2.CompensationCommand:
    out = common_pb2.CompensationCommand(tool_id=cmd.get("tool_id") or "", reason=cmd.get("reason") or "")
    out.params.CopyFrom(to_struct(cmd.get("params") or {}))
    return out


# The rows the saga answers as a journal entry. WhyNotWritten reads the step through an outer join
# (its step columns are NULL when the run has no such step); the journal answers it as the step
# only when it has one.
StepRow: TypeAlias = (
    journal_sql.BeginStepRow
    | journal_sql.RecordStepRow
    | journal_sql.FinishStepRow
    | journal_sql.WhyNotWrittenRow
    | journal_sql.JournalStepsRow
    | operator_actions_sql.PlannedStepsRow
    | operator_actions_sql.ResolveStepRow
)


def step_to_pb(row: StepRow) -> common_pb2.SagaStep:
    step_id, step_type, status = row["step_id"], row["step_type"], row["status"]
    seq, attempt = row["seq"], row["attempt"]
    if step_id is None or step_type is None or status is None or seq is None or attempt is None:
        raise ValueError("a WhyNotWritten row without a step is no journal entry")
    step = common_pb2.SagaStep(
        step_id=step_id,
        step_type=step_type_to_pb(step_type),
        tool_id=row["tool_id"] or "",
        status=step_status_to_pb(status),
        error=row["error"] or "",
        seq=seq,
        attempt=attempt,
        resolved_by=row["resolved_by"] or "",
        resolution_reason=row["resolution_reason"] or "",
    )
    if row["tool_params"] is not None:
        step.tool_params.CopyFrom(to_struct(row["tool_params"]))
    if row["result"] is not None:
        step.result.CopyFrom(to_struct(row["result"]))
    if row["compensation_cmd"] is not None:
        step.compensation_cmd.CopyFrom(compensation_to_pb(row["compensation_cmd"]))
    for field, t in (
        (step.started_at, ts(row["started_at"])),
        (step.completed_at, ts(row["completed_at"])),
        (step.compensated_at, ts(row["compensated_at"])),
    ):
        if t is not None:
            field.CopyFrom(t)
    return step
