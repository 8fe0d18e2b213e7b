"""The rollout guide's worker process (tests/test_rollout.py, docs/versioning.md): one handler whose
runs park the ways agent runs do (an approval, a callback wait, a durable sleep, a fan-in of child
runs), in two versions of its code: v1, and v2, which adds a step behind ctx.patched("notify").
The process's build is AWOOOP_WORKER_BUILD, as the Kubernetes manifest sets it.

    python -m tests.rollout_worker OUT_DIR PROJECT [PROJECT ...]

Each step function appends {"build", "run_id", "step", "pid"} to OUT_DIR/steps; what a run hands
out (an approval token, the pid inside the slow step) goes to OUT_DIR/handout. The `slow` run's
second step blocks until OUT_DIR/go exists.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from awooop.worker import Child, RunContext, StepCall, Worker


def make_handler(out: Path) -> Any:
    def append(name: str, line: dict[str, Any]) -> None:
        with open(out / name, "a") as f:
            f.write(json.dumps(line) + "\n")

    def step(ctx: RunContext, name: str) -> Any:
        def fn(call: StepCall) -> dict[str, Any]:
            append("steps", {"build": ctx.build_id, "run_id": ctx.run_id, "step": name, "pid": os.getpid()})
            return {"build": ctx.build_id}

        return fn

    async def blocked(call: StepCall) -> dict[str, Any]:
        append("handout", {"run_id": call.run_id, "kind": "inside", "value": os.getpid()})
        # the go-ahead is a file, not a signal: it must reach a process started after it was given
        while not (out / "go").exists():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        append("steps", {"build": "", "run_id": call.run_id, "step": "slow", "pid": os.getpid()})
        return {}

    async def handle(ctx: RunContext) -> dict[str, Any] | None:
        pattern = ctx.input["pattern"]
        await ctx.step("prepare", step(ctx, "prepare"))
        notified = None
        if ctx.build_id == "v2":  # v2's change, for the runs that reach it on v2's code
            notified = await ctx.patched("notify")
            if notified:
                await ctx.step("notify", step(ctx, "notify"))
        if pattern == "approval":
            approval = await ctx.request_approval("go on?", ttl=600)
            if not approval.granted:
                append("handout", {"run_id": ctx.run_id, "kind": "approval", "value": approval.token})
                return None
        elif pattern == "callback":
            token = await ctx.create_wait(600, step_id="cb")
            await ctx.wait(token)
        elif pattern == "sleep":
            await ctx.sleep(3600, step_id="nap")  # the test ends it by hand (ExpireWait)
        elif pattern == "children":
            kids = [Child({"pattern": "approval"}, step_id=f"c{i}") for i in range(2)]
            await ctx.run_children(kids)
        elif pattern == "slow":
            await ctx.step("slow", blocked)
        await ctx.step("finish", step(ctx, "finish"))
        return {"finished_on": ctx.build_id, "notified": notified}

    return handle


async def main(out: str, projects: list[str]) -> None:
    worker = Worker(
        make_handler(Path(out)),
        projects=projects,
        concurrency=8,
        lease_ttl=3,
        heartbeat_interval=0.5,
        claim_wait=1,
        shutdown_grace=2,
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
