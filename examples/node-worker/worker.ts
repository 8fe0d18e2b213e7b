// A complete awooop worker in TypeScript: journaled steps, a tool call with compensation, a
// durable wait, an approval (the story of examples/worker.py, with @awooop/worker).
//
//   AWOOOP_API_KEY          a key with the worker role in the project
//   AWOOOP_SCHEDULER_ADDR   else AWOOOP_SCHEDULER_PORT on AWOOOP_HOST, else 127.0.0.1:50052
//   AWOOOP_SAGA_ADDR        else AWOOOP_SAGA_PORT on AWOOOP_HOST, else 127.0.0.1:50053
//   AWOOOP_GATEWAY_ADDR     else AWOOOP_GATEWAY_PORT on AWOOOP_HOST, else 127.0.0.1:50054
//   AWOOOP_PROJECT          default demo
//   AWOOOP_WORKER_HTTP_PORT serve /metrics and /healthz there (unset: no HTTP server)
import { ToolClient, Worker, type CompensationCommand, type Json, type RunContext } from "@awooop/worker";

const tools = new ToolClient(); // the tool gateway
const SETTLE_SECONDS = Number(process.env.SETTLE_SECONDS || 2);

// how to undo the scale if the run is rejected or fails
function scaleBack(result: Json): CompensationCommand {
  return {
    toolId: "k8s_scale_deployment",
    params: { deployment: result.deployment, replicas: result.previous_replicas },
    reason: "scale back",
  };
}

async function handle(ctx: RunContext): Promise<Json | undefined> {
  const target = { deployment: "api", replicas: 3 };
  await ctx.step("diagnose", () => ({ cause: "cpu saturated" }), { stepType: "llm_call" });
  // a progress event for whoever watches the run (npm run watch -- RUN_ID); keyed: not repeated
  await ctx.emit({ cause: "cpu saturated", next: "scale api to 3" }, { kind: "diagnosed", key: "diagnosed" });
  await ctx.step("scale", tools.execute, { toolId: "k8s_scale_deployment", params: target, compensation: scaleBack });
  // let the new replicas settle before asking: a durable sleep parks the run (no lease, no worker
  // slot); it is claimed again when the time is up and this handler runs from the top, done steps skipped
  await ctx.sleep(SETTLE_SECONDS, { stepId: "settle" });
  const approval = await ctx.requestApproval("Keep api at 3 replicas?");
  if (!approval.granted) {
    // the run now waits; once approved this handler runs again, done steps skipped
    console.log(`awooop runs approve ${ctx.runId} --token ${approval.token}`);
    return undefined;
  }
  return { kept: target };
}

// stops cleanly on SIGTERM / SIGINT: running handlers finish or are handed back
const worker = new Worker(handle, { projects: [process.env.AWOOOP_PROJECT || "demo"], concurrency: 8 });
worker.run().then(
  () => {
    tools.close();
    process.exit(0);
  },
  (err: unknown) => {
    console.error(String(err)); // e.g. runs it could not settle, named
    process.exit(1);
  },
);
