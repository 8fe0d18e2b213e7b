"""The durable wait RPCs (CreateWait, AwaitWait, CompleteWait, ExpireWait, ListWaits): validate,
call waits, build the answer. wait_pb builds the Wait message StartChildRuns answers too."""

from __future__ import annotations

from typing import Any

import asyncpg

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from services.common.auth import current_principal
from services.common.limits import MAX_ID, MAX_PROVIDER_EVENT_ID
from services.common.runs import channel_from_pb, set_time
from services.common.runstate import RunStatus, WaitKind, WaitStatus
from services.common.settings import Settings
from services.common.validate import Violations, to_struct
from services.scheduler import metrics, waits
from services.scheduler.rpc_fields import MAX_WAIT_TIMEOUT, lease

MAX_LOOKBACK = 86400.0  # an event wait's look-back
DEFAULT_LOOKBACK = 300.0

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


def wait_pb(row: Any, *, run_id: str = "", project_id: str = "", status: str = "") -> scheduler_pb2.Wait:
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


class WaitRpcs:
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings

    async def create_wait(self, request: scheduler_pb2.CreateWaitRequest) -> scheduler_pb2.CreateWaitResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
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
            wait=wait_pb(created.wait), token=created.token, callback_url=url, created=created.created
        )

    async def await_wait(self, request: scheduler_pb2.AwaitWaitRequest) -> scheduler_pb2.AwaitWaitResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
        wait_id = v.uuid("wait_id", request.wait_id)
        v.raise_if_any()
        parked, row = await waits.park(self.pool, current_principal(), run_id, attempt, wait_id)
        if parked:
            metrics.TRANSITIONS.labels(RunStatus.WAITING_TOOL).inc()
        return scheduler_pb2.AwaitWaitResponse(
            parked=parked, wait=wait_pb(row, run_id=run_id, project_id=row["cur_project"], status=row["wait_status"])
        )

    async def complete_wait(self, request: scheduler_pb2.CompleteWaitRequest) -> scheduler_pb2.CompleteWaitResponse:
        v = Violations()
        wait_id = v.uuid("wait_id", request.wait_id)
        result = v.struct("result", request.result, max_bytes=self.settings.max_step_result_bytes)
        v.raise_if_any()
        row = await waits.complete(self.pool, current_principal(), wait_id, result)
        if row["resumed"]:
            metrics.TRANSITIONS.labels(RunStatus.PENDING).inc()
        return scheduler_pb2.CompleteWaitResponse(
            wait=wait_pb(row, status=row["wait_status"]), resumed=bool(row["resumed"])
        )

    async def expire_wait(self, request: scheduler_pb2.ExpireWaitRequest) -> scheduler_pb2.ExpireWaitResponse:
        v = Violations()
        wait_id = v.uuid("wait_id", request.wait_id)
        v.raise_if_any()
        row = await waits.expire_by_hand(self.pool, current_principal(), wait_id)
        if row["resumed"]:
            metrics.TRANSITIONS.labels(RunStatus.PENDING).inc()
        return scheduler_pb2.ExpireWaitResponse(
            wait=wait_pb(row, status=row["wait_status"]), resumed=bool(row["resumed"])
        )

    async def list_waits(self, request: scheduler_pb2.ListWaitsRequest) -> scheduler_pb2.ListWaitsResponse:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        v.raise_if_any()
        rows = await waits.list_for_run(self.pool, current_principal(), run_id)
        return scheduler_pb2.ListWaitsResponse(waits=[wait_pb(r) for r in rows])
