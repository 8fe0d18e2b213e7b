"""The waits soak's worker process (tests/test_waits_soak.py), on the Python SDK.

    python -m tests.soak_waits_worker WORKER_ID PROJECTS ERRORS_FILE TOKENS_FILE

Settings as tests/soak_worker.py's (whose recording client it uses). Each run's input carries
its plan (`soak`, tests/harness/soak_waits_plan.py); schedule ticks carry none and complete. A
handler records an llm_call step and writes two knowledge entries through the gateway (two tool
steps, each compensated by deleting its entry, so a failed run's compensation order shows in the
gateway's log), works a while (so SIGKILLs land mid-run), then by its kind:

| kind     | the handler                                                                          |
|----------|--------------------------------------------------------------------------------------|
| plain    | ok: returns; flaky: raises on its first attempt; fatal: ctx.fail(E-SOAK-FATAL)      |
| url, rpc | creates a wait, hands its callback URL to the system that answers it (a line of      |
|          | TOKENS_FILE, every attempt that gets a token; and a progress event), parks on it; the |
|          | test completes it by the URL or by CompleteWait with a tool key. verdict reject:     |
|          | ctx.fail(E-SOAK-REJECTED); flaky_after: the attempt that first received the outcome  |
|          | raises once (the next one reads it from the journal)                                 |
| timeout  | a wait nobody completes: WaitTimeout left uncaught (FAILED E-WAIT-TIMEOUT)           |
| sleep    | a durable sleep                                                                      |
| children | run_children (plain children with their own outcomes and the parent's keys); a child |
|          | that did not complete: ctx.fail(E-SOAK-CHILD)                                        |
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, TextIO

from awooop.worker import Child, RunContext, StepCall, ToolClient
from tests.harness.soak_waits_plan import CHILD_CODE, FATAL_CODE, REJECTED_CODE
from tests.soak_worker import serve

WAIT_STEP = "approval"  # the wait's step id: its outcome is journaled as "approval:outcome"
TOOL_STEPS = ("remember", "remember-2")


def entry_of(run_id: str, step_id: str) -> str:
    """The knowledge entry a run's tool step writes (and its compensation deletes)."""
    return f"ws-{run_id}-{step_id}"


async def think(call: StepCall) -> dict[str, Any]:
    return {"thought": f"plan for {call.run_id}"}


def make_handler(tools: ToolClient, tokens: TextIO) -> Any:
    async def handle(ctx: RunContext) -> dict[str, Any] | None:
        plan = ctx.input.get("soak")
        plan = plan if isinstance(plan, dict) else {"kind": "plain", "outcome": "ok"}
        kind = str(plan.get("kind", "plain"))
        await ctx.step("think", think, step_type="llm_call")
        for step_id in TOOL_STEPS:
            entry = entry_of(ctx.run_id, step_id)
            await ctx.step(
                step_id,
                tools.execute,
                tool_id="knowledge_write",
                params={"entry_id": entry, "content": f"run {ctx.run_id}"},
                compensation={"tool_id": "knowledge_delete", "params": {"entry_id": entry}, "reason": "forget"},
            )
        await asyncio.sleep(float(plan.get("work_ms", 100)) / 1000)
        if kind in ("url", "rpc", "timeout"):
            token = await ctx.create_wait(float(plan["timeout"]), step_id=WAIT_STEP)
            if token.callback_url:  # this attempt got a token of the wait: hand it out (earlier ones stay valid)
                line = {"run_id": ctx.run_id, "attempt": ctx.attempt, "callback_url": token.callback_url}
                tokens.write(json.dumps(line) + "\n")
                await ctx.emit({"wait_id": token.wait_id}, kind="waiting")
            posted = await ctx.wait(token)  # WaitTimeout uncaught: FAILED E-WAIT-TIMEOUT, compensated
            if plan.get("flaky_after") and ctx.actions.get(f"{WAIT_STEP}:outcome") == "execute":
                raise RuntimeError("soak: fails the attempt that received the wait's outcome")
            if posted.get("verdict") == "reject":
                await ctx.fail("soak: rejected by the wait's completion", retryable=False, error_code=REJECTED_CODE)
                return None
            # how this attempt got the outcome: "execute" from the wait, "skip" from the journal
            return {"posted": posted, "outcome_action": ctx.actions.get(f"{WAIT_STEP}:outcome", "")}
        if kind == "sleep":
            await ctx.sleep(float(plan["seconds"]))
            return {"slept": plan["seconds"]}
        if kind == "children":
            keys = list(ctx.run.concurrency_keys)  # the parent's: its slots are free while it is parked
            specs = [
                Child({"soak": {"kind": "plain", "outcome": o, "work_ms": 50}}, concurrency_keys=keys)
                for o in plan["children"]
            ]
            outcomes = await ctx.run_children(specs)
            if not all(o.ok for o in outcomes):
                failed = ", ".join(f"{o.step_id} {o.status}" for o in outcomes if not o.ok)
                await ctx.fail(f"soak: children did not complete: {failed}", retryable=False, error_code=CHILD_CODE)
                return None
            return {"children": [o.run_id for o in outcomes]}
        outcome = str(plan.get("outcome", "ok"))
        if outcome == "flaky" and ctx.attempt == 1:
            raise RuntimeError("soak: flaky handler fails its first attempt")
        if outcome == "fatal":
            await ctx.fail("soak: fatal", retryable=False, error_code=FATAL_CODE)
            return None
        return {"attempt": ctx.attempt}

    return handle


async def main(worker_id: str, projects: list[str], errors_path: str, tokens_path: str) -> None:
    tokens = open(tokens_path, "a", buffering=1)  # line-buffered: a SIGKILL loses nothing written
    await serve(worker_id, projects, errors_path, lambda tools: make_handler(tools, tokens), concurrency=8)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]))
