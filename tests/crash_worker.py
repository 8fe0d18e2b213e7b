"""The crash-point enumeration's worker process (tests/test_crash_points.py): the documented
patterns of docs/worker-sdk.md as handlers, on the Python SDK, with a CrashPoint interceptor
(tests/harness/crashpoints.py) in its one Client, so it dies exactly at the point it is given.

    python -m tests.crash_worker POINT|pause@POINT|record|none OUT_DIR PROJECT [PROJECT ...]

POINT kills the process there; pause@POINT freezes it there until OUT_DIR/go exists.

Environment: AWOOOP_API_KEY and the services' addresses, as for any worker. Each run's input names
its pattern; a run without one (an event's own run) completes at once. Every tool step writes a
knowledge entry through the reference gateway under the step's idempotency key, with a
compensation that deletes it, so the gateway's log shows each side effect and each undo.

| pattern      | the handler                                                                           |
|--------------|---------------------------------------------------------------------------------------|
| steps        | two tool steps, completes                                                             |
| fail         | two tool steps, then ctx.fail: FAILED, both undone in reverse                         |
| callback     | a tool step, create_wait, hands the URL out from a journaled step (OUT_DIR/handout),   |
|              | waits, a tool step                                                                    |
| approval     | a tool step, request_approval (the token handed out in OUT_DIR/handout), a tool step |
| sleep        | a tool step, a durable sleep of 1 s, a tool step                                      |
| event        | a tool step, wait_for_event on the API channel's correlation key (the run's tag)      |
| parked_tool  | a tool step, call_tool_parked (the gateway posts the outcome back), a tool step       |
| children     | a tool step, run_children of two children (each one tool step), completes             |
| tree         | as children, but the first child parks (a durable sleep) after its step and the       |
|              | second fails after its step (compensated on its own): the cancel enumeration's tree   |
| stream       | a tool step, then three groups of five tokens (ctx.stream_token), each flushed as a   |
|              | checkpoint (ctx.flush_tokens: one PublishTokens each, the first token its own), done  |
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from awooop.worker import Child, Client, RunContext, StepCall, ToolClient, Worker
from tests.harness.crashpoints import CrashPoint

LEASE_TTL = 3.0
APPROVAL_TTL = 8.0  # a token lost with its answer (a crash there) expires: the run fails, compensated


def make_handler(tools: ToolClient, crash: CrashPoint, handout: str) -> Any:
    def hand_out(run_id: str, kind: str, value: str) -> None:
        with open(handout, "a") as out:
            out.write(json.dumps({"run_id": run_id, "kind": kind, "value": value}) + "\n")

    def hand_out_step(run_id: str, kind: str, value: str) -> Any:
        """hand_out as a journaled step's function."""

        def fn(call: StepCall) -> dict[str, Any]:
            hand_out(run_id, kind, value)
            return {"handed_out": kind}

        return fn

    async def write(ctx: RunContext, step_id: str) -> None:
        entry = f"{ctx.run_id}-{step_id}"
        await ctx.step(
            step_id,
            tools.execute,
            tool_id="knowledge_write",
            params={"entry_id": entry, "content": {"step": step_id}},
            compensation={"tool_id": "knowledge_delete", "params": {"entry_id": entry}, "reason": "undo"},
        )

    async def handle(ctx: RunContext) -> dict[str, Any] | None:
        pattern = ctx.input.get("pattern")
        if not pattern:
            return {}  # an event's own run
        crash.track(ctx.run_id)
        if ctx.input.get("child") is not None:
            await write(ctx, "child")
            if ctx.input.get("park"):
                await ctx.sleep(0.5, step_id="nap")
            if ctx.input.get("fail"):
                await ctx.fail("the child fails", error_code="E-CRASH-CHILD")
                return None
            return {"child": ctx.input["child"]}
        await write(ctx, "a")
        if pattern == "steps":
            await write(ctx, "b")
            return {"steps": 2}
        if pattern == "fail":
            await write(ctx, "b")
            await ctx.fail("the pattern fails", error_code="E-CRASH-FAIL")
            return None
        if pattern == "callback":
            token = await ctx.create_wait(60, step_id="cb")
            if token.callback_url:
                await ctx.step("hand-out", hand_out_step(ctx.run_id, "url", token.callback_url))
            posted = await ctx.wait(token)
            await write(ctx, "b")
            return {"posted": posted}
        if pattern == "approval":
            approval = await ctx.request_approval("go on?", ttl=APPROVAL_TTL)
            if not approval.granted:
                hand_out(ctx.run_id, "approval", approval.token)
                return None
            await write(ctx, "b")
            return {"approved_by": approval.decided_by}
        if pattern == "sleep":
            await ctx.sleep(1.0, step_id="nap")
            await write(ctx, "b")
            return {"slept": True}
        if pattern == "event":
            event = await ctx.wait_for_event(ctx.input["tag"], timeout=60, step_id="ev")
            return {"event": event["payload"]}
        if pattern == "parked_tool":
            entry = f"{ctx.run_id}-parked"
            result = await ctx.call_tool_parked(
                "knowledge_write",
                {"entry_id": entry, "content": "parked", "simulate_delay_ms": 300},
                timeout=60,
                step_id="deploy",
                compensation={"tool_id": "knowledge_delete", "params": {"entry_id": entry}, "reason": "undo"},
            )
            await write(ctx, "b")
            return {"tool": result}
        if pattern == "stream":
            for group in range(3):
                for i in range(5):
                    await ctx.stream_token(f"{group}.{i} ")  # the stream's first token is sent at once
                await ctx.flush_tokens()  # a checkpoint: the calls are the same on every run
            return {"streamed": 15}
        if pattern in ("children", "tree"):
            kids = [
                Child({"pattern": pattern, "child": i, "park": pattern == "tree" and i == 0,
                       "fail": pattern == "tree" and i == 1}, step_id=f"c{i}")
                for i in range(2)
            ]  # fmt: skip
            outcomes = await ctx.run_children(kids)
            return {"children": [o.status for o in outcomes]}
        raise ValueError(f"unknown pattern {pattern!r}")

    return handle


async def main(point: str, out_dir: str, projects: list[str]) -> None:
    pause = point.startswith("pause@")
    point = point.removeprefix("pause@")
    crash = CrashPoint(
        point if point != "none" else "record",
        record_to=os.path.join(out_dir, "calls"),
        pause_dir=out_dir if pause else None,
    )
    if point == "none":
        crash.record_to = None
    client = Client(interceptors=[crash])
    tools = ToolClient(client=client)
    handler = make_handler(tools, crash, os.path.join(out_dir, "handout"))
    worker = Worker(
        handler, projects=projects, client=client, concurrency=1 if point != "none" else 8,
        lease_ttl=LEASE_TTL, heartbeat_interval=0.5, claim_wait=1, shutdown_grace=2,
    )  # fmt: skip
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
