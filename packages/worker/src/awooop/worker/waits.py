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
from typing import Any

from google.protobuf import duration_pb2

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.tools.v1 import tools_pb2
from awooop.worker.run_scope import RunScope, StepCall
from awooop.worker.structs import from_struct, to_struct

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


class ParkedToolFailed(Exception):
    """A parked tool call's tool posted an error ({"error": ..., "code": ...}) instead of a
    result: the step is journaled failed (nothing to compensate) and this is raised; left
    uncaught, the attempt fails as for any handler error."""

    def __init__(self, step_id: str, message: str, code: str = "") -> None:
        super().__init__(f"tool of step {step_id} failed: {message}" + (f" ({code})" if code else ""))
        self.step_id = step_id
        self.message = message
        self.code = code


def tool_result(step_id: str, posted: dict[str, Any]) -> dict[str, Any]:
    """The result a parked tool call's tool posted: {"result": {...}}, or {"error": "...",
    "code": "..."} (ParkedToolFailed); a body with neither key is the result itself."""
    if "error" in posted and "result" not in posted:
        raise ParkedToolFailed(step_id, str(posted["error"]), str(posted.get("code") or ""))
    result = posted.get("result", posted)
    if not isinstance(result, dict):
        raise ParkedToolFailed(step_id, f"posted result is not an object: {type(result).__name__}")
    return result


@dataclass(frozen=True)
class WaitToken:
    """A wait of this run. `callback_url` (POST a JSON object to it) and `token` exist only in
    the answer that issued them: an attempt that finds an ended wait gets neither, and one that
    finds an open wait again (its predecessor crashed before it parked) gets a new token; the
    earlier ones keep completing the wait, so a URL already handed out stays valid."""

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
    ctx: RunScope,
    timeout: float,
    step_id: str,
    kind: scheduler_pb2.WaitKind.ValueType,
    *,
    correlation_key: str = "",
    channel: common_pb2.ChannelType.ValueType = common_pb2.CHANNEL_TYPE_API,
    lookback: float = 0.0,
) -> WaitToken:
    await ctx._reach(step_id, common_pb2.STEP_TYPE_CALLBACK, ordered=False)
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


async def outcome(ctx: RunScope, token: WaitToken) -> tuple[bool, dict[str, Any]]:
    """(completed, result) of the wait; parks the run (raising RunParked) while it is open."""
    step_id = f"{token.step_id}:outcome"
    await ctx._reach(step_id, common_pb2.STEP_TYPE_CALLBACK, ordered=False)
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


async def start_tool(ctx: RunScope, call: StepCall, token: WaitToken) -> None:
    """Starts a parked tool call's tool (ExecuteTool with the wait's callback URL). The gateway
    de-duplicates by the step's idempotency key: a repeat (this attempt's predecessor crashed
    before it parked) runs nothing again and redirects the outcome to the new URL. A gateway
    that ran the tool at once instead (accepted = false) answered its result: it completes the
    wait here, so the run goes on without parking."""
    resp = await ctx.client.call(
        ctx.client.gateway.ExecuteTool,
        tools_pb2.ExecuteToolRequest(
            tool_id=call.tool_id,
            params=to_struct(call.params),
            idempotency_key=call.idempotency_key,
            project_id=call.project_id,
            run_id=call.run_id,
            reason=f"step {call.step_id} (attempt {call.attempt}), parked",
            callback_url=token.callback_url,
        ),
    )
    if not resp.accepted:
        await ctx.client.call(
            ctx.client.scheduler.CompleteWait,
            scheduler_pb2.CompleteWaitRequest(
                wait_id=token.wait_id, result=to_struct({"result": from_struct(resp.result)})
            ),
        )
