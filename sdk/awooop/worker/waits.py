"""Durable waits (docs/worker-sdk.md, "Durable waits"): `ctx.create_wait`, `ctx.wait`, `ctx.sleep`.

A run that waits does not keep its handler running. `await ctx.wait(token)` on an open wait
parks the run (WAITING_TOOL without a lease: no worker slot, no heartbeat, no connection) and
unwinds the handler with RunParked, which the Worker catches. When the wait ends (completed by
CompleteWait or its callback URL, or timed out) the run is claimable again; a worker runs the
handler from the top, finished steps skip, `create_wait` finds the same wait by its step id, and
`wait` returns its outcome at once.

Each is journaled as a `callback` step (RecordStep): `<step_id>` when the wait is created, with
its id and expiry, and `<step_id>:outcome` when the handler received its outcome. Step ids are
given, or numbered in call order per attempt (`wait-1`, `sleep-1`, ...): the handler must create
its waits in the same order on every attempt, as it runs its steps.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from google.protobuf import duration_pb2

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.structs import from_struct, to_struct

if TYPE_CHECKING:
    from awooop.worker.context import RunContext

TIMED_OUT_CODE = "E-WAIT-TIMEOUT"  # the error code of a run whose handler let WaitTimeout escape


class RunParked(BaseException):
    """The run is parked on a wait and no longer held by this worker: the handler unwinds. A
    BaseException (as asyncio.CancelledError is), so a handler's `except Exception` does not
    swallow it; the Worker catches it and counts the run as parked."""


class WaitTimeout(Exception):
    """The wait's time ran out before anyone completed it. Catch it to go on another way; left
    uncaught, the Worker fails the run (not retryable, error code E-WAIT-TIMEOUT) and the saga
    compensates its completed steps."""

    def __init__(self, token: WaitToken) -> None:
        super().__init__(f"wait {token.step_id} ({token.wait_id}) timed out")
        self.token = token


@dataclass(frozen=True)
class WaitToken:
    """A wait of this run. `callback_url` (POST a JSON object to it) and `token` exist only in
    the answer that issued them: an attempt that finds an ended wait gets neither, and one that
    finds an open wait again (its predecessor crashed before it parked) gets a new token that
    replaces the earlier one."""

    wait_id: str
    step_id: str
    expires_at: dt.datetime
    token: str = ""
    callback_url: str = ""


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


async def create(
    ctx: RunContext,
    timeout: float,
    step_id: str,
    kind: scheduler_pb2.WaitKind.ValueType,
    *,
    correlation_key: str = "",
    channel: common_pb2.ChannelType.ValueType = common_pb2.CHANNEL_TYPE_API,
    lookback: float = 0.0,
) -> WaitToken:
    request = scheduler_pb2.CreateWaitRequest(lease=ctx.lease, step_id=step_id, kind=kind, timeout=_duration(timeout))
    if kind == scheduler_pb2.WAIT_KIND_EVENT:
        request.match_channel = channel
        request.correlation_key = correlation_key
        if lookback > 0:
            request.lookback.CopyFrom(_duration(lookback))
    resp = await ctx.client.call(ctx.client.scheduler.CreateWait, request)
    w = resp.wait
    token = WaitToken(w.wait_id, step_id, w.expires_at.ToDatetime(dt.UTC), resp.token, resp.callback_url)
    if resp.created:
        await ctx._record(
            saga_pb2.RecordStepRequest(
                lease=ctx.lease,
                step_id=step_id,
                step_type=common_pb2.STEP_TYPE_CALLBACK,
                result=to_struct(
                    {"wait_id": w.wait_id, "kind": _KIND_NAMES[kind], "expires_at": token.expires_at.isoformat()}
                ),
            )
        )
    return token


_KIND_NAMES = {
    scheduler_pb2.WAIT_KIND_TOKEN: "token",
    scheduler_pb2.WAIT_KIND_SLEEP: "sleep",
    scheduler_pb2.WAIT_KIND_EVENT: "event",
}


async def outcome(ctx: RunContext, token: WaitToken) -> tuple[bool, dict[str, Any]]:
    """(completed, result) of the wait; parks the run (raising RunParked) while it is open."""
    step_id = f"{token.step_id}:outcome"
    known = await ctx._known(step_id)
    if known is not None and known.status == common_pb2.STEP_STATUS_COMPLETED:
        ctx.actions[step_id] = "skip"
        recorded = from_struct(known.result)
        return recorded.get("outcome") == "completed", dict(recorded.get("result") or {})
    # marked as leaving our hands while the call is in flight (the worker neither renews nor
    # cancels it meanwhile); a refused call unmarks it
    async with ctx._ending("parked"):
        resp = await ctx.client.call(
            ctx.client.scheduler.AwaitWait, scheduler_pb2.AwaitWaitRequest(lease=ctx.lease, wait_id=token.wait_id)
        )
    if resp.parked:
        ctx.log.info("parked on wait %s until %s", token.step_id, token.expires_at.isoformat())
        raise RunParked(token.step_id)
    ctx.outcome = None  # the wait had ended: the run is still ours, under the same lease
    completed = resp.wait.status == scheduler_pb2.WAIT_STATUS_COMPLETED
    result = from_struct(resp.wait.result) if completed else {}
    ctx.actions[step_id] = "execute"
    await ctx._record(
        saga_pb2.RecordStepRequest(
            lease=ctx.lease,
            step_id=step_id,
            step_type=common_pb2.STEP_TYPE_CALLBACK,
            result=to_struct(
                {"outcome": "completed" if completed else "timed_out", "result": result, "by": resp.wait.completed_by}
            ),
        )
    )
    return completed, result
