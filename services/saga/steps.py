"""Journal entries: the store's strings <-> protobuf enums, a row of awooop_saga_step ->
common.v1.SagaStep, and JSON values as callers meant them (integral numbers stay integers).

Statuses and step types are stored lower-case, exactly as seed ADR-119 D1 writes them; they are
declared in services/common/sagastate.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from awooop.common.v1 import common_pb2
from services.common.db import Row
from services.common.runs import ts
from services.common.sagastate import StepType
from services.common.validate import to_struct

# Tools whose side effects cannot be undone (seed ADR-119 D3, D6): never carry a compensation command.
IRREVERSIBLE_TOOLS = ("k8s_exec_pod",)


def step_type_from_pb(value: int) -> StepType:
    return StepType(common_pb2.StepType.Name(value).removeprefix("STEP_TYPE_").lower())  # type: ignore[arg-type]


def step_type_to_pb(value: str) -> int:
    return common_pb2.StepType.Value(f"STEP_TYPE_{value.upper()}")


def step_status_to_pb(value: str) -> int:
    return common_pb2.StepStatus.Value(f"STEP_STATUS_{value.upper()}")


def compensation_to_pb(cmd: Mapping[str, Any]) -> common_pb2.CompensationCommand:
    out = common_pb2.CompensationCommand(tool_id=cmd.get("tool_id") or "", reason=cmd.get("reason") or "")
    out.params.CopyFrom(to_struct(cmd.get("params") or {}))
    return out


def step_to_pb(row: Row) -> common_pb2.SagaStep:
    step = common_pb2.SagaStep(
        step_id=row["step_id"],
        step_type=step_type_to_pb(row["step_type"]),  # type: ignore[arg-type]
        tool_id=row["tool_id"] or "",
        status=step_status_to_pb(row["status"]),  # type: ignore[arg-type]
        error=row["error"] or "",
        seq=row["seq"],
        attempt=row["attempt"],
        resolved_by=row["resolved_by"] or "",
        resolution_reason=row["resolution_reason"] or "",
    )
    if row["tool_params"] is not None:
        step.tool_params.CopyFrom(to_struct(row["tool_params"]))
    if row["result"] is not None:
        step.result.CopyFrom(to_struct(row["result"]))
    if row["compensation_cmd"] is not None:
        step.compensation_cmd.CopyFrom(compensation_to_pb(row["compensation_cmd"]))
    for name in ("started_at", "completed_at", "compensated_at"):
        t = ts(row[name])
        if t is not None:
            getattr(step, name).CopyFrom(t)
    return step
