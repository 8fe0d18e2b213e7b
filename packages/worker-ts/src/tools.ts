// ToolClient: calls a ToolGateway (awooop.tools.v1) with a step's idempotency key, so a step
// retried after a crash does not run the tool twice.
//
//   const tools = new ToolClient(); // AWOOOP_GATEWAY_ADDR, else AWOOOP_GATEWAY_PORT, else 127.0.0.1:50054
//   await ctx.step("scale", tools.execute, { toolId: "k8s_scale_deployment", params: { deployment: "api", replicas: 3 } });
import { Client } from "./client";
import type { Json, StepCall } from "./context";

export interface ToolClientOptions {
  gateway?: string;
  key?: string;
  /** Deadline of a tool call in seconds (default 30). */
  timeout?: number;
  /** An open Client to use instead of opening one. */
  client?: Client;
}

export class ToolClient {
  readonly client: Client;
  /** idempotency key -> whether the gateway replayed it (the tool did not run again). */
  readonly replayed = new Map<string, boolean>();
  private readonly timeout: number;
  private readonly own: boolean;

  constructor(options: ToolClientOptions = {}) {
    this.timeout = options.timeout ?? 30;
    this.own = options.client === undefined;
    this.client = options.client ?? new Client({ gateway: options.gateway, key: options.key, timeout: this.timeout });
  }

  /** Step function: runs call.toolId with call.params under call.idempotencyKey. */
  readonly execute = (call: StepCall): Promise<Json> =>
    this.call(call.toolId, call.params, {
      idempotencyKey: call.idempotencyKey,
      projectId: call.projectId,
      runId: call.runId,
      reason: `step ${call.stepId} (attempt ${call.attempt})`,
    });

  async call(
    toolId: string,
    params: Json,
    options: { idempotencyKey: string; projectId: string; runId?: string; reason?: string },
  ): Promise<Json> {
    const resp = await this.client.call(
      this.client.gateway,
      "executeTool",
      {
        toolId,
        params,
        idempotencyKey: options.idempotencyKey,
        projectId: options.projectId,
        runId: options.runId ?? "",
        reason: options.reason ?? "",
        callbackUrl: "", // answered now (a parked tool call posts to a wait's callback URL instead)
      },
      this.timeout,
    );
    this.replayed.set(options.idempotencyKey, resp.replayed);
    return (resp.result ?? {}) as Json;
  }

  close(): void {
    if (this.own) this.client.close();
  }
}
