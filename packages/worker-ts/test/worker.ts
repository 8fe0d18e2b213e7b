// The worker tests/test_ts_worker.py runs as a real process: a Worker from this package (imported
// as a user would, from the built package) whose handler does what each run's input.mode asks.
// Events go to stdout as JSON lines; the worker's own log to stderr.
//
//   node test/dist/worker.js '{"projects": ["wp"], "leaseTtl": 30, ...}'   (WorkerOptions as JSON)
import {
  ChildrenTimeout,
  common,
  HandlerStopped,
  ParkedToolFailed,
  WaitTimeout,
  Worker,
  type EventMatch,
  type Json,
  type RunContext,
  type WorkerOptions,
  watchRun,
} from "@awooop/worker";

const emit = (event: Json): void => {
  process.stdout.write(`${JSON.stringify(event)}\n`);
};

/** Resolves when signal aborts. */
const until = (signal: AbortSignal): Promise<void> =>
  new Promise((resolve) => (signal.aborted ? resolve() : signal.addEventListener("abort", () => resolve(), { once: true })));

// SIGUSR2 lets a test tell a waiting handler to go on
let goOn: () => void = () => undefined;
const wentOn = new Promise<void>((resolve) => (goOn = resolve));
process.on("SIGUSR2", () => goOn());

async function scale(ctx: RunContext): Promise<Json> {
  await ctx.step("diagnose", () => ({ cause: "cpu saturated" }), { stepType: "llm_call" });
  const scaled = await ctx.step(
    "scale",
    async (call) => {
      emit({ event: "inside-scale", run_id: ctx.runId, attempt: ctx.attempt, key: call.idempotencyKey, retry: call.retry });
      if (ctx.input.block_attempt === ctx.attempt) {
        await until(call.signal); // a tool call that takes long: stopped only by the worker
        const why = call.signal.reason instanceof HandlerStopped ? call.signal.reason.why : String(call.signal.reason);
        emit({ event: "step-aborted", run_id: ctx.runId, attempt: ctx.attempt, why });
        throw call.signal.reason;
      }
      return { deployment: "api", previous_replicas: 1, replicas: 3 };
    },
    {
      toolId: "k8s_scale_deployment",
      params: { deployment: "api", replicas: 3 },
      compensation: (result) => ({
        toolId: "k8s_scale_deployment",
        params: { deployment: result.deployment, replicas: result.previous_replicas },
        reason: "scale back",
      }),
    },
  );
  return { attempt: ctx.attempt, replicas: scaled.replicas };
}

/**
 * The code of the worker's build (ctx.buildId): v1 fetches, plans, asks for approval, applies;
 * v2-reordered plans before it fetches; v2-patched adds a check behind ctx.patched("extra-check").
 */
async function versioned(ctx: RunContext): Promise<Json> {
  const step = (name: string) => () => {
    emit({ event: "step", step: name, build: ctx.buildId, run_id: ctx.runId });
    return {};
  };
  let patched: boolean | undefined;
  if (ctx.buildId === "v2-reordered") {
    await ctx.step("plan", step("plan"));
    await ctx.step("fetch", step("fetch"), { stepType: "llm_call" });
  } else {
    await ctx.step("fetch", step("fetch"), { stepType: "llm_call" });
    if (ctx.buildId === "v2-patched") {
      patched = await ctx.patched("extra-check");
      if (patched) await ctx.step("check", step("check"));
    }
    await ctx.step("plan", step("plan"));
  }
  const approval = await ctx.requestApproval("go on?", { ttl: 600 });
  if (!approval.granted) {
    emit({ event: "approval-requested", run_id: ctx.runId, token: approval.token, build: ctx.buildId });
    return {};
  }
  await ctx.step("apply", step("apply"));
  return { finished_on: ctx.buildId, patched: patched ?? null };
}

/** An event wait: the event the run's input.match names, journaled; input.throw_after_event fails the attempt that received it once. */
async function waitForEvent(ctx: RunContext): Promise<Json> {
  let event: Json;
  try {
    event = await ctx.waitForEvent(ctx.input.match as EventMatch, {
      timeout: Number(ctx.input.timeout ?? 120),
      lookback: typeof ctx.input.lookback === "number" ? ctx.input.lookback : undefined,
    });
  } catch (err) {
    if (err instanceof TypeError) return { bad_match: err.message }; // thrown before anything was sent
    if (!(err instanceof WaitTimeout)) throw err;
    emit({ event: "timed-out", run_id: ctx.runId, actions: ctx.actions });
    return { timed_out: true };
  }
  emit({ event: "got-event", run_id: ctx.runId, attempt: ctx.attempt, actions: ctx.actions, got: event });
  if (ctx.input.throw_after_event && ctx.actions["event-1:outcome"] === "execute") {
    throw new Error("failing the attempt that received the event");
  }
  return { event_run_id: event.run_id as string, payload: event.payload as Json };
}

/**
 * A parked tool call: knowledge_write through the gateway, which posts the outcome to the wait's
 * callback URL after input.delay_ms; compensated by deleting the entry. input.then: "return"
 * (default), "flaky" (the step after it fails once: the next attempt skips the tool step), "fail"
 * (the run fails after it: compensated); input.tool_error makes the tool post an error.
 */
async function parkedTool(ctx: RunContext): Promise<Json | undefined> {
  await ctx.step("before", () => {
    emit({ event: "ran-before", run_id: ctx.runId, attempt: ctx.attempt });
    return { done: true };
  });
  const entry = `kb-${ctx.runId}`;
  const params: Json = { entry_id: entry, content: "deployed", simulate_delay_ms: Number(ctx.input.delay_ms ?? 300) };
  if (ctx.input.tool_error) params.simulate_failure = String(ctx.input.tool_error);
  emit({ event: "calling-tool", run_id: ctx.runId, attempt: ctx.attempt });
  let result: Json;
  try {
    result = await ctx.callToolParked("knowledge_write", params, {
      timeout: Number(ctx.input.timeout ?? 120),
      stepId: "deploy",
      compensation: { toolId: "knowledge_delete", params: { entry_id: entry }, reason: "undo deploy" },
    });
  } catch (err) {
    if (err instanceof ParkedToolFailed) return { tool_failed: err.toolMessage, code: err.code };
    throw err; // RunParked unwinds; WaitTimeout fails the run (E-WAIT-TIMEOUT)
  }
  emit({ event: "tool-done", run_id: ctx.runId, attempt: ctx.attempt, actions: ctx.actions, result });
  await ctx.step("after", () => {
    // fails in the attempt that finished the tool call: the next one finds the tool step completed
    if (ctx.input.then === "flaky" && ctx.actions.deploy !== "skip") throw new Error("after fails once");
    return { after: true };
  });
  if (ctx.input.then === "fail") {
    await ctx.fail("a later step went wrong", { errorCode: "E-LATER" });
    return undefined;
  }
  return { tool_result: result };
}

async function streamTokens(ctx: RunContext): Promise<Json> {
  const count = Number(ctx.input.count ?? 100);
  const words = Array.from({ length: count }, (_, i) => `w${i + 1} `);
  for (const w of words.slice(0, count / 2)) await ctx.streamToken(w);
  await ctx.emit({ half: true }, { kind: "half" });
  async function* rest(): AsyncGenerator<string> {
    for (const w of words.slice(count / 2)) {
      yield w;
      if (w.endsWith("0 ")) await new Promise((resolve) => setTimeout(resolve, 2)); // a model's pace
    }
  }
  const piped = await ctx.pipeTokens(rest());
  return { streamed: count, piped: piped.length };
}

async function watchTokens(ctx: RunContext): Promise<Json> {
  const parts: string[] = [];
  let batches = 0;
  let gaps = 0;
  let seqs = 0;
  for await (const item of watchRun(ctx.client, String(ctx.input.target), 0, { tokens: true })) {
    if ("offset" in item) continue;
    if ("kind" in item && item.kind === "tokens") {
      if (item.firstSeq !== seqs + 1) gaps += 1;
      seqs = item.firstSeq + item.tokens.length - 1;
      parts.push(item.tokens.join(""));
      batches += 1;
    } else if ("kind" in item && item.kind === "token_gap") gaps += 1;
  }
  return { text: parts.join(""), batches, gaps };
}

async function handle(ctx: RunContext): Promise<Json | undefined> {
  if (ctx.run.channelType !== common.ChannelType.CHANNEL_TYPE_API) return { channel_event: true }; // waitForEvent's events
  const mode = String(ctx.input.mode ?? "scale");
  emit({ event: "handler-started", mode, run_id: ctx.runId, attempt: ctx.attempt, resumed: ctx.resumed });
  switch (mode) {
    case "finish": // finishes inside the shutdown grace period
      await until(ctx.stopping);
      return { finished_during_grace: true };
    case "hold": // never finishes (and ignores every signal): handed back after the grace period
      await new Promise(() => undefined);
      return undefined;
    case "cancel": {
      await ctx.step("prepare", () => ({ ok: true }));
      emit({ event: "prepared", run_id: ctx.runId });
      await until(ctx.signal);
      emit({ event: "stopped", run_id: ctx.runId, why: (ctx.signal.reason as HandlerStopped).why });
      return undefined;
    }
    case "together": // waits for SIGUSR2, then returns an output of output_bytes characters (or a small one)
      emit({ event: "waiting", run_id: ctx.runId });
      await wentOn;
      return typeof ctx.input.output_bytes === "number" ? { big: "x".repeat(ctx.input.output_bytes) } : { ok: true };
    case "quick":
      return { ok: true };
    case "stream": // streams input.count tokens: the first half one by one, the rest piped, an emit between
      return streamTokens(ctx);
    case "watch-tokens": // watches input.target's tokens (watchRun with tokens) until it ends
      return watchTokens(ctx);
    case "throw": // an uncaught error: the attempt fails, retryable
      throw new Error(`bad input on attempt ${ctx.attempt}`);
    case "stale": // waits for SIGUSR2, then writes with a token that may have moved on
      emit({ event: "waiting", run_id: ctx.runId });
      await wentOn;
      await ctx.step("late", () => ({ written: true }));
      return { should: "not complete" };
    case "approval": {
      await ctx.step("prepare", () => ({ prepared: true }));
      const approval = await ctx.requestApproval("Apply the change?", { ttl: 120 });
      emit({ event: "actions", run_id: ctx.runId, attempt: ctx.attempt, actions: ctx.actions });
      if (!approval.granted) {
        emit({ event: "approval-requested", run_id: ctx.runId, token: approval.token });
        return undefined;
      }
      await ctx.step("apply", () => ({ applied: true }));
      return { approved_by: approval.decidedBy };
    }
    case "wait": {
      // a durable wait: parks (the handler unwinds with RunParked), runs again from the top once
      // the callback URL is posted, "before" skipped, and the wait answers the posted result
      await ctx.step("before", () => {
        emit({ event: "ran-before", run_id: ctx.runId, attempt: ctx.attempt });
        return { done: true };
      });
      const token = await ctx.createWait(Number(ctx.input.timeout ?? 120));
      emit({ event: "wait-created", run_id: ctx.runId, wait_id: token.waitId, callback_url: token.callbackUrl });
      let posted: Json;
      try {
        posted = await ctx.wait(token);
      } catch (err) {
        if (!(err instanceof WaitTimeout)) throw err;
        emit({ event: "timed-out", run_id: ctx.runId, actions: ctx.actions });
        return { timed_out: true };
      }
      emit({ event: "actions", run_id: ctx.runId, attempt: ctx.attempt, actions: ctx.actions });
      return { posted };
    }
    case "event":
      return waitForEvent(ctx);
    case "parked-tool":
      return parkedTool(ctx);
    case "children": {
      // two children in one call, the parent parked until both ended: one completes, one fails
      const outcomes = await ctx.runChildren([
        { input: { mode: "quick" } },
        { input: { mode: "throw" }, maxAttempts: 1 },
      ]);
      emit({ event: "actions", run_id: ctx.runId, attempt: ctx.attempt, actions: ctx.actions });
      const seen = outcomes.map((o) => ({
        step_id: o.stepId,
        run_id: o.runId,
        status: o.status,
        ok: o.ok,
        output: o.output,
        error_code: o.errorCode,
      }));
      return { outcomes: seen };
    }
    case "labelled-children": {
      // two children that need a GPU, whichever worker runs the parent
      const outcomes = await ctx.runChildren([
        { input: { mode: "quick" }, requiredLabels: { gpu: "a100" } },
        { input: { mode: "quick" }, requiredLabels: { gpu: "a100" } },
      ]);
      return { children: outcomes.map((o) => o.runId) };
    }
    case "child-handle": {
      // one child started at once, its result awaited later (the parent parks on `<stepId>:wait`)
      const child = await ctx.startChild({ mode: "quick" }, { stepId: "one" });
      emit({ event: "child-started", run_id: ctx.runId, child: child.runId, started: child.started });
      const outcome = await child.result();
      return { child: outcome.runId, status: outcome.status, output: outcome.output };
    }
    case "children-timeout":
      try {
        await ctx.runChildren([{ input: { mode: "quick" }, delay: 3600 }], { timeout: 0.5 });
      } catch (err) {
        if (!(err instanceof ChildrenTimeout)) throw err;
        return { children_timed_out: err.stepId };
      }
      return { children_timed_out: false };
    case "versioned":
      return versioned(ctx);
    case "sleep": // a durable sleep: parked, resumed by its time
      emit({ event: "sleeping", run_id: ctx.runId });
      await ctx.sleep(Number(ctx.input.seconds ?? 0.5));
      return { slept: true };
    default:
      return scale(ctx);
  }
}

const options = JSON.parse(process.argv[2] ?? "{}") as WorkerOptions;
const worker = new Worker(handle, options);
emit({ event: "started", worker_id: worker.workerId });
worker.run().then(
  () => {
    emit({ event: "exited", stats: worker.stats });
    process.exit(0);
  },
  (err: unknown) => {
    process.stderr.write(`${err instanceof Error ? `${err.name}: ${err.message}` : String(err)}\n`);
    emit({ event: "exited", stats: worker.stats, error: String(err) });
    process.exit(1);
  },
);
