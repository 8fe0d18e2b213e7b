"""The demo's worker: the seeds' story as a handler (used by `awooop demo`, runnable by hand).

    python -m awooop.worker.demo_worker --project demo [--pause-after scale]

For each Telegram update like "/scale api 3":
  1. diagnose   llm_call   (a stand-in for the model: recommends the scale)
  2. scale      tool_call  k8s_scale_deployment through the reference gateway, with the step's
                           idempotency key; compensation: scale back to previous_replicas
  3. approval   the run waits for a human; the worker hands the token out (stdout) and returns
  4. report     callback   once approved (the handler runs again; steps 1-2 are skipped)

--pause-after scale makes the worker stop after step 2 and wait to be killed (the demo's crash).
Every event is one JSON line on stdout, so a driver (the demo, a test) can follow along;
logs go to stderr. Addresses and the key come from the usual AWOOOP_* variables or flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
from typing import Any

from awooop.worker import RunContext, StepCall, ToolClient, Worker

TOOL = "k8s_scale_deployment"


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, default=str), flush=True)


def parse_request(run_input: dict[str, Any]) -> tuple[str, int]:
    """'/scale <deployment> <replicas>' from a Telegram update; defaults: api, 3."""
    text = str((run_input.get("message") or {}).get("text") or "")
    m = re.match(r"\s*/scale\s+([a-z0-9][a-z0-9.-]*)\s+(\d+)", text)
    return (m.group(1), int(m.group(2))) if m else ("api", 3)


def diagnose(call: StepCall) -> dict[str, Any]:
    # stand-in for an LLM call: deterministic, no side effect, never compensated
    deployment, replicas = call.params["deployment"], call.params["replicas"]
    return {
        "finding": f"{deployment}: p99 latency 2.4 s, CPU saturated on every pod",
        "recommendation": {"action": "scale", "deployment": deployment, "replicas": replicas},
    }


def undo_scale(result: dict[str, Any]) -> dict[str, Any] | None:
    previous = result.get("previous_replicas")
    if previous is None:
        return None
    return {
        "tool_id": TOOL,
        "params": {"deployment": result.get("deployment"), "replicas": previous},
        "reason": "SAGA compensation: scale deployment back",
    }


def build_handler(tools: ToolClient, pause_after: str | None) -> Any:
    async def handle(ctx: RunContext) -> dict[str, Any] | None:
        emit("claimed", run_id=ctx.run_id, attempt=ctx.attempt, resumed=ctx.resumed, worker_id=ctx.worker_id)
        deployment, replicas = parse_request(ctx.input)
        target = {"deployment": deployment, "replicas": replicas}

        finding = await ctx.step("diagnose", diagnose, step_type="llm_call", params=target)
        emit("step", run_id=ctx.run_id, step_id="diagnose", action=ctx.actions["diagnose"], result=finding)
        if pause_after == "diagnose":
            emit("paused", run_id=ctx.run_id, after="diagnose")
            await asyncio.Event().wait()

        scaled = await ctx.step("scale", tools.execute, tool_id=TOOL, params=target, compensation=undo_scale)
        emit("step", run_id=ctx.run_id, step_id="scale", action=ctx.actions["scale"], result=scaled)
        if pause_after == "scale":
            emit("paused", run_id=ctx.run_id, after="scale")
            await asyncio.Event().wait()  # the demo kills this process here

        was = scaled.get("previous_replicas", "?")
        approval = await ctx.request_approval(f"Keep deployment {deployment} at {replicas} replicas (was {was})?")
        if not approval.granted:
            emit("approval_requested", run_id=ctx.run_id, token=approval.token, expires_at=approval.expires_at)
            return None
        emit("approved", run_id=ctx.run_id, decided_by=approval.decided_by)

        await ctx.step("report", lambda call: {"reply": f"{deployment} stays at {replicas} replicas"})
        emit("completed", run_id=ctx.run_id)
        return {"deployment": deployment, "replicas": replicas}

    return handle


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m awooop.worker.demo_worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--project", action="append", required=True, help="project to claim from (repeatable)")
    p.add_argument("--key", default=None, help="API key (default AWOOOP_API_KEY)")
    p.add_argument("--scheduler", default=None)
    p.add_argument("--saga", default=None)
    p.add_argument("--gateway", default=None)
    p.add_argument("--worker-id", default=None)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--lease-ttl", type=float, default=None, help="seconds (default: the scheduler's)")
    p.add_argument("--heartbeat", type=float, default=None, help="heartbeat interval in seconds")
    p.add_argument("--claim-wait", type=float, default=5.0)
    p.add_argument("--shutdown-grace", type=float, default=5.0)
    p.add_argument("--pause-after", choices=("diagnose", "scale"), default=None)
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level, format="%(asctime)s %(name)s %(message)s")

    tools = ToolClient(args.gateway, key=args.key)
    worker = Worker(
        build_handler(tools, args.pause_after),
        projects=args.project,
        key=args.key,
        scheduler=args.scheduler,
        saga=args.saga,
        worker_id=args.worker_id,
        concurrency=args.concurrency,
        lease_ttl=args.lease_ttl,
        heartbeat_interval=args.heartbeat,
        claim_wait=args.claim_wait,
        shutdown_grace=args.shutdown_grace,
    )
    emit("started", worker_id=worker.worker_id, projects=args.project)
    try:
        await worker.run()
    finally:
        await tools.close()
    emit("stopped", worker_id=worker.worker_id, outcomes=worker.stats.by_outcome)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
