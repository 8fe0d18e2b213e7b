"""A row of awooop_run_state -> common.v1.Run on the claim cycle's hot paths (ClaimRuns,
CompleteRuns): the same message as services.common.runs.run_to_pb (a test compares them
field by field), built about twice as fast. Timestamps are set from integer arithmetic instead of
Timestamp.FromDatetime (which goes through a time tuple and timegm), and enum values come from
dicts; in the claim benchmark run_to_pb was a tenth of the scheduler's CPU."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from awooop.common.v1 import common_pb2
from services.common.runs import CHANNELS, SAGA_STATUSES, STATUSES, _obj, run_to_pb
from services.common.validate import to_struct

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_STATUS = {s: common_pb2.RunStatus.Value(f"RUN_STATUS_{s}") for s in STATUSES}
_CHANNEL = {c: common_pb2.ChannelType.Value(f"CHANNEL_TYPE_{c.upper()}") for c in CHANNELS}
_SAGA = {s: common_pb2.SagaStatus.Value(f"SAGA_STATUS_{s.upper()}") for s in SAGA_STATUSES}
_TIMES = (
    "lease_until",
    "heartbeat_at",
    "reaped_at",
    "approval_expires_at",
    "compensation_started_at",
    "compensation_completed_at",
    "created_at",
    "updated_at",
    "not_before",
)


def run_pb(row: Mapping[str, Any]) -> common_pb2.Run:
    status, channel, saga = row["status"], row["channel_type"], row["saga_status"]
    if status not in _STATUS or channel not in _CHANNEL or (saga and saga not in _SAGA):
        return run_to_pb(row)  # a value the fast path does not know: the general path decides
    run = common_pb2.Run(
        run_id=str(row["run_id"]),
        project_id=row["project_id"],
        channel_type=_CHANNEL[channel],  # type: ignore[arg-type]
        provider_event_id=row["provider_event_id"] or "",
        status=_STATUS[status],  # type: ignore[arg-type]
        max_attempts=row["max_attempts"],
        attempt_count=row["attempt_count"],
        worker_id=row["worker_id"] or "",
        failure_reason=row["failure_reason"] or "",
        error_code=row["error_code"] or "",
        cancel_requested=row["cancel_requested"],
        approval_decided_by=row["approval_decided_by"] or "",
        approval_summary=row["approval_summary"] or "",
        saga_status=_SAGA[saga] if saga else 0,  # type: ignore[arg-type]
    )
    run.input.CopyFrom(to_struct(_obj(row["input"])))
    if row["output"] is not None:
        run.output.CopyFrom(to_struct(_obj(row["output"])))
    for name in _TIMES:
        value = row[name]
        if value is not None:
            if value.tzinfo is None:  # as FromDatetime: a naive time is UTC
                value = value.replace(tzinfo=dt.UTC)
            d = value - _EPOCH
            t = getattr(run, name)
            t.seconds = d.days * 86400 + d.seconds
            t.nanos = d.microseconds * 1000
    return run
