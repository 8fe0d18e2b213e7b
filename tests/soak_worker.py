"""The invariant soak's worker process (tests/test_invariant_soak.py), on the Python SDK.

    python tests/soak_worker.py WORKER_ID PROJECTS ERRORS_FILE

Addresses and key come from AWOOOP_SCHEDULER_ADDR, AWOOOP_SAGA_ADDR, AWOOOP_GATEWAY_ADDR and
AWOOOP_API_KEY; AWOOOP_SOAK_LEASE_TTL sets the lease asked for. Each run's input carries its
plan (`soak.outcome`, `soak.work_ms`); schedule ticks carry none and complete. A handler records
an llm_call step, writes a knowledge entry through the gateway (compensated by deleting it), works
a while (so SIGKILLs land mid-run), then ends as its plan says:

| outcome  | the handler                                                                        |
|----------|------------------------------------------------------------------------------------|
| ok       | returns (COMPLETED)                                                                |
| flaky    | raises on its first attempt, then returns                                          |
| doomed   | raises every time (retried until its attempts are used: FAILED, compensated)       |
| fatal    | `ctx.fail(retryable=False, error_code=E-SOAK-FATAL)` (FAILED at once, compensated) |
| nonretry | `ctx.fail(retryable=True, error_code=E-SOAK-NONRETRY)`: its project's policy names |
|          | the code as never retried, so FAILED at once                                       |

Every failed call the SDK makes is appended to ERRORS_FILE as one JSON line (method, code,
reason), so the test sees the status codes every client saw, also of SIGKILLed workers."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from awooop.worker import AwooopError, Client, RunContext, StepCall, ToolClient, Worker

FATAL_CODE = "E-SOAK-FATAL"
NONRETRY_CODE = "E-SOAK-NONRETRY"


class RecordingClient(Client):
    """The SDK's client, appending every failed call's status to a file before raising it."""

    def __init__(self, errors_path: str, **kw: Any) -> None:
        super().__init__(**kw)
        self._errors = open(errors_path, "a", buffering=1)  # line-buffered: a SIGKILL loses nothing written

    async def call(self, method: Any, request: Any, *, timeout: float | None = None) -> Any:
        try:
            return await super().call(method, request, timeout=timeout)
        except AwooopError as err:
            line = {"method": err.method, "code": err.code.name, "reason": err.reason}
            self._errors.write(json.dumps(line) + "\n")
            raise


def plan_of(ctx: RunContext) -> dict[str, Any]:
    plan = ctx.input.get("soak")
    return plan if isinstance(plan, dict) else {}


async def think(call: StepCall) -> dict[str, Any]:
    return {"thought": f"plan for {call.run_id}"}


def make_handler(tools: ToolClient) -> Any:
    async def handle(ctx: RunContext) -> dict[str, Any] | None:
        plan = plan_of(ctx)
        outcome = str(plan.get("outcome", "ok"))
        await ctx.step("think", think, step_type="llm_call")
        entry = f"soak-{ctx.run_id}"
        await ctx.step(
            "remember",
            tools.execute,
            tool_id="knowledge_write",
            params={"entry_id": entry, "content": f"run {ctx.run_id}"},
            compensation={"tool_id": "knowledge_delete", "params": {"entry_id": entry}, "reason": "forget"},
        )
        await asyncio.sleep(float(plan.get("work_ms", 100)) / 1000)
        if outcome == "doomed" or (outcome == "flaky" and ctx.attempt == 1):
            raise RuntimeError(f"soak: {outcome} handler fails attempt {ctx.attempt}")
        if outcome == "fatal":
            await ctx.fail("soak: fatal", retryable=False, error_code=FATAL_CODE)
            return None
        if outcome == "nonretry":
            await ctx.fail("soak: a code the policy never retries", retryable=True, error_code=NONRETRY_CODE)
            return None
        return {"entry": entry, "attempt": ctx.attempt}

    return handle


class RunFormatter(logging.Formatter):
    """Log lines that name the run (the SDK's run logger adds run_id and attempt)."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        run_id = getattr(record, "run_id", None)
        return f"{line} [run {run_id} attempt {getattr(record, 'attempt', '?')}]" if run_id else line


async def serve(
    worker_id: str, projects: list[str], errors_path: str, make: Callable[[ToolClient], Any], *, concurrency: int
) -> None:
    """A soak worker process: the SDK Worker with the soak's lease and timeouts, its handler
    make(tools), its RPC errors recorded in errors_path (the waits soak's worker too)."""
    handler = logging.StreamHandler()
    handler.setFormatter(RunFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    lease_ttl = float(os.environ.get("AWOOOP_SOAK_LEASE_TTL", "2"))
    client = RecordingClient(errors_path, timeout=5.0)
    tools = ToolClient(client=client, timeout=5.0)
    worker = Worker(
        make(tools),
        projects=projects,
        worker_id=worker_id,
        concurrency=concurrency,
        lease_ttl=lease_ttl,
        heartbeat_interval=lease_ttl / 5,
        claim_wait=2.0,
        call_timeout=5.0,
        shutdown_grace=1.0,
        client=client,
    )
    print(json.dumps({"worker_id": worker_id, "pid": os.getpid()}), flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2].split(","), sys.argv[3], make_handler, concurrency=6))
