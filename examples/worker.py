"""A complete awooop worker: journaled steps, a tool call with compensation, an approval."""

import asyncio

from awooop.worker import RunContext, ToolClient, Worker

tools = ToolClient()  # the tool gateway: AWOOOP_GATEWAY_ADDR (default 127.0.0.1:50054)


def scale_back(result: dict) -> dict:  # how to undo the scale if the run is rejected or fails
    params = {"deployment": result["deployment"], "replicas": result["previous_replicas"]}
    return {"tool_id": "k8s_scale_deployment", "params": params, "reason": "scale back"}


async def handle(ctx: RunContext) -> dict | None:
    target = {"deployment": "api", "replicas": 3}
    await ctx.step("diagnose", lambda call: {"cause": "cpu saturated"}, step_type="llm_call")
    await ctx.step("scale", tools.execute, tool_id="k8s_scale_deployment", params=target, compensation=scale_back)
    approval = await ctx.request_approval("Keep api at 3 replicas?")
    if not approval.granted:  # the run now waits; once approved this handler runs again, done steps skipped
        print(f"awooop runs approve {ctx.run_id} --token {approval.token}", flush=True)
        return None
    return {"kept": target}


# key and addresses from AWOOOP_API_KEY, AWOOOP_SCHEDULER_ADDR, AWOOOP_SAGA_ADDR; stops cleanly on SIGTERM
asyncio.run(Worker(handle, projects=["demo"], concurrency=8).run())
