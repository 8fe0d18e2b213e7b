// RunContext: what a handler gets for one claimed run.
//
// Journaled steps (seed ADR-119 D2): `await ctx.step(stepId, fn, options)`. A step completed by an
// earlier attempt is skipped and its recorded result returned; a step an earlier attempt left
// pending (it may or may not have happened) runs again with the same idempotency key, so the tool
// can recognise the repeat. Every call carries the lease's fencing token.
//
// Tool calls are journaled twice: BeginStep before they run (the pending record a crash mid-call
// leaves behind) and CompleteStep after. Steps without side effects (llm_call, callback) are
// journaled once, after they ran, with RecordStep; which of them an earlier attempt completed is
// read from the journal once per attempt (never on a run's first attempt, whose journal is empty).
//
// JavaScript cannot cancel a promise: the worker stops a handler by aborting `ctx.signal` (lease
// lost, cancel requested, shutdown). From then on every ctx call throws HandlerStopped, and the
// worker no longer waits for the handler: pass `ctx.signal` (or `call.signal`) to what you await.
import type { Attributes, Context, Span, Tracer } from "@opentelemetry/api";
import { childSpec, ChildrenTimeout, outcomeOf, type Child, type ChildOutcome } from "./children";
import type { Client } from "./client";
import type { CompletionBatcher } from "./completions";
import {
  AwooopError,
  JOURNAL_TOO_LARGE,
  LeaseLost,
  ParkedToolFailed,
  RunFinished,
  RunParked,
  WaitTimeout,
} from "./errors";
import { keyOf, MATCH_CHANNELS, type EventMatch } from "./eventMatches";
import {
  ChannelType,
  RunStatus,
  StepStatus,
  StepType,
  type LeaseToken,
  type Run,
  type SagaStep,
} from "./gen/awooop/common/v1/common";
import { StepAction } from "./gen/awooop/saga/v1/saga";
import {
  WaitKind,
  WaitStatus,
  type ChildRun,
  type ChildRunSpec,
  type ClaimedRun,
} from "./gen/awooop/scheduler/v1/scheduler";
import * as metrics from "./metrics";
import { NONDETERMINISM_CODE, Nondeterminism, PATCH_PREFIX, ReplayCheck } from "./replay";
import { duration } from "./time";
import { DEFAULT_STREAM, TokenStreams } from "./tokens";
import { inSpan } from "./tracing";

/** A JSON object (a google.protobuf.Struct): inputs, outputs, step params and results. */
export type Json = { [key: string]: unknown };

export type StepKind = "llm_call" | "tool_call" | "approval_request" | "callback";
/** What this attempt did at a step id: a step's action, or `children` where runChildren returned. */
export type StepActionName = "execute" | "skip" | "retry" | "children" | "patched" | "unpatched";
/** A started child (ctx.startChild): `await handle.result()` parks the parent until it ended. */
export interface ChildHandle {
  runId: string;
  stepId: string;
  /** This call started it (false: an earlier attempt had, under the same step id). */
  started: boolean;
  result(options?: { timeout?: number }): Promise<ChildOutcome>;
}

/** Why the worker stopped a handler. */
export type StopReason = "lease_lost" | "cancel_requested" | "shutdown";

const STEP_TYPES: Readonly<Record<StepKind, StepType>> = {
  llm_call: StepType.STEP_TYPE_LLM_CALL,
  tool_call: StepType.STEP_TYPE_TOOL_CALL,
  approval_request: StepType.STEP_TYPE_APPROVAL_REQUEST,
  callback: StepType.STEP_TYPE_CALLBACK,
};
const ACTIONS: Readonly<Partial<Record<StepAction, metrics.StepAction>>> = {
  [StepAction.STEP_ACTION_EXECUTE]: "execute",
  [StepAction.STEP_ACTION_SKIP]: "skip",
  [StepAction.STEP_ACTION_RETRY]: "retry",
};
// step kinds journaled once, after they ran (RecordStep)
const RECORDED_AFTER: readonly StepKind[] = ["llm_call", "callback"];

/** What a step function receives. Pass idempotencyKey to the tool: it is the same on every attempt. */
export interface StepCall {
  runId: string;
  projectId: string;
  stepId: string;
  idempotencyKey: string;
  toolId: string;
  params: Json;
  attempt: number;
  /** An earlier attempt began this step and did not record its end. */
  retry: boolean;
  /** Aborted when the worker stops the handler: pass it to the tool call. */
  signal: AbortSignal;
}

/** How to undo a completed tool step when the run later fails, is rejected or cancelled. */
export interface CompensationCommand {
  toolId: string;
  params?: Json;
  reason?: string;
}

export type Compensation =
  | CompensationCommand
  | ((result: Json) => CompensationCommand | null | undefined)
  | null
  | undefined;

export interface StepOptions {
  /** Default: tool_call when toolId is given, else callback. */
  stepType?: StepKind;
  toolId?: string;
  params?: Json;
  /** Tool calls only: a command, or a function of the step's result returning one (or null). */
  compensation?: Compensation;
}

export type StepFn = (call: StepCall) => Json | null | undefined | void | Promise<Json | null | undefined | void>;

/**
 * granted: the approver approved (the run was resumed): go on. Otherwise the approval was requested
 * now: hand `token` to the approver and return; the run waits without a lease.
 */
export interface Approval {
  granted: boolean;
  token: string;
  expiresAt?: Date;
  decidedBy: string;
}

/**
 * A wait of this run (ctx.createWait). `callbackUrl` (POST a JSON object to it) and `token` exist
 * only in the answer that issued them: an attempt that finds an ended wait gets neither, and one
 * that finds an open wait again (its predecessor crashed before it parked) gets a new token that
 * replaces the earlier one.
 */
export interface WaitToken {
  waitId: string;
  stepId: string;
  expiresAt: Date | undefined;
  token: string;
  callbackUrl: string;
}

/** What a parked tool call (ctx.callToolParked) takes besides its tool and params. */
export interface ParkedToolOptions {
  /** Seconds the tool has to post its outcome (then WaitTimeout). */
  timeout: number;
  /** Default `tool-1`, `tool-2`, ... in call order. */
  stepId?: string;
  /** As a tool step's: a command, or a function of the posted result returning one (or null). */
  compensation?: Compensation;
}

const WAIT_KIND_NAMES: Readonly<Partial<Record<WaitKind, string>>> = {
  [WaitKind.WAIT_KIND_TOKEN]: "token",
  [WaitKind.WAIT_KIND_SLEEP]: "sleep",
  [WaitKind.WAIT_KIND_EVENT]: "event",
};

/** Thrown by every ctx call once the worker stopped the handler (ctx.signal's reason). */
export class HandlerStopped extends Error {
  constructor(readonly why: StopReason) {
    super(`handler stopped: ${why}`);
    this.name = "HandlerStopped";
  }
}

/** One claimed run: its input, its lease, journaled steps and the run's end. */
export class RunContext {
  readonly run: Run;
  /** The fencing token (runId, attempt): every call below carries it. */
  readonly lease: LeaseToken;
  /** An earlier attempt already ran (the journal may hold completed steps). */
  readonly resumed: boolean;
  /** The run's input (for channel events, the provider's payload). */
  readonly input: Json;
  /** stepId -> execute | skip | retry, in the order this attempt met them. */
  readonly actions: Record<string, StepActionName> = {};
  /** completed | failed | waiting_approval, once the run left the handler's hands. */
  outcome: string | undefined;
  /** W3C traceparent of the run's trace ("" when the scheduler traced nothing). */
  readonly traceparent: string;
  /** The context of this run's span (the Worker's); undefined when tracing is off. */
  traceContext: Context | undefined;
  private readonly controller = new AbortController();
  // the journal as this attempt knows it (stepId -> entry), for steps journaled after they ran;
  // undefined until read. A first attempt's journal is empty: nothing to read.
  private journal: Map<string, SagaStep> | undefined;
  private journalTooLarge = false;
  // a resumed attempt's check of its calls against the journal it found (replay.ts); undefined
  // until the journal is read, and on a first attempt (nothing to replay)
  private replay: ReplayCheck | undefined;
  /** Set once the handler's code was found not to replay the journal: the worker holds the run. */
  nondeterminism: Nondeterminism | undefined;
  // ctx.patched's answers in this attempt, by change id
  private readonly patches = new Map<string, boolean>();
  // durable waits' step ids numbered per kind, in call order (wait-1, sleep-1, ...)
  private readonly waitNumbers = new Map<string, number>();
  /** ctx.streamToken's streams. */
  readonly tokens: TokenStreams;

  constructor(
    readonly client: Client,
    claimed: ClaimedRun,
    readonly workerId: string,
    /** Aborted when the worker shuts down: finish within its grace period or be handed back. */
    readonly stopping: AbortSignal,
    private readonly completions?: CompletionBatcher,
    private readonly tracer?: Tracer,
  ) {
    if (claimed.run === undefined || claimed.lease === undefined) throw new Error("a claimed run without run or lease");
    this.run = claimed.run;
    this.lease = claimed.lease;
    this.resumed = claimed.resumed;
    this.traceparent = claimed.traceparent;
    this.input = (claimed.run.input ?? {}) as Json;
    this.journal = this.attempt > 1 || this.resumed ? undefined : new Map();
    this.tokens = new TokenStreams(client, this.lease);
  }

  get runId(): string {
    return this.lease.runId;
  }
  get projectId(): string {
    return this.run.projectId;
  }
  get attempt(): number {
    return this.lease.attempt;
  }
  /** The build this attempt runs on (the claiming worker's; "" when it declared none). */
  get buildId(): string {
    return this.run.buildId;
  }
  get finished(): boolean {
    return this.outcome !== undefined;
  }
  /** Aborted (reason: a HandlerStopped) when the worker stops this handler: lease lost, cancel requested, shutdown. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** The worker's: stops the handler (every ctx call throws HandlerStopped from now on). */
  stop(why: StopReason): void {
    this.controller.abort(new HandlerStopped(why));
  }

  private live(what: string): void {
    this.signal.throwIfAborted();
    if (this.outcome !== undefined) {
      throw new RunFinished(`${what}: run ${this.runId} already ${this.outcome}; the handler should return`);
    }
    if (this.nondeterminism !== undefined) throw this.nondeterminism; // caught by the handler: still true
  }

  /**
   * A journaling call of the handler, checked against the journal a resumed attempt found
   * (replay.ts). Throws Nondeterminism (and remembers it) when the code does not replay it.
   */
  private async reach(
    stepId: string,
    kind: number,
    toolId = "",
    params?: Record<string, unknown>,
    ordered = true,
  ): Promise<void> {
    if (this.journalTooLarge || (this.journal !== undefined && this.replay === undefined)) return;
    await this.known(stepId); // reads the journal once
    if (this.replay === undefined) return; // too large to read whole: not checked
    try {
      this.replay.reach(stepId, kind, toolId, params, ordered);
    } catch (err) {
      if (err instanceof Nondeterminism) this.nondeterminism = err;
      throw err;
    }
  }

  /** Before the run completes: throws the Nondeterminism found earlier, if any (a handler that caught it must not complete the run). */
  checkReplayed(): void {
    if (this.nondeterminism !== undefined) throw this.nondeterminism;
  }

  // --- journaled steps ---

  /**
   * Runs fn at most once per run (per stepId) and returns its result. fn may be sync or async and
   * returns an object (nothing means {}). If fn throws, the step is journaled failed and the error
   * rethrown; if the handler is stopped inside a tool call's fn, the step stays pending on purpose
   * (the next attempt retries it with the same idempotency key).
   */
  async step(stepId: string, fn: StepFn, options: StepOptions = {}): Promise<Json> {
    const attributes = {
      "awooop.step_id": stepId,
      "awooop.step_type": options.stepType ?? "",
      "awooop.tool_id": options.toolId ?? "",
    };
    return this.traced("awooop.worker.step", attributes, async (span) => {
      const result = await this.untracedStep(stepId, fn, options);
      span?.setAttribute("awooop.action", this.actions[stepId] ?? "");
      return result;
    });
  }

  /** fn in a span of this run (undefined: tracing is off). */
  private traced<T>(name: string, attributes: Attributes, fn: (span: Span | undefined) => Promise<T>): Promise<T> {
    if (this.tracer === undefined || this.traceContext === undefined) return fn(undefined);
    return inSpan(this.tracer, name, this.traceContext, attributes, fn);
  }

  /** An action met at a step id: the attempt's record and the steps counter. */
  private met(stepId: string, action: metrics.StepAction): void {
    this.actions[stepId] = action;
    metrics.STEPS.inc({ action });
  }

  /** step without its span. */
  private async untracedStep(stepId: string, fn: StepFn, options: StepOptions): Promise<Json> {
    this.live(`step ${stepId}`);
    if (stepId.startsWith(PATCH_PREFIX)) throw new TypeError(`step ids starting with '${PATCH_PREFIX}' are ctx.patched's`);
    const kind: StepKind = options.stepType ?? (options.toolId ? "tool_call" : "callback");
    if (!(kind in STEP_TYPES)) throw new TypeError(`stepType must be one of ${Object.keys(STEP_TYPES).join(", ")}`);
    const params = { ...(options.params ?? {}) };
    await this.reach(stepId, STEP_TYPES[kind], options.toolId ?? "", params);
    if (RECORDED_AFTER.includes(kind) && !options.toolId && !this.journalTooLarge) {
      const known = await this.known(stepId);
      if (!this.journalTooLarge && (known === undefined || (known.stepType === STEP_TYPES[kind] && !known.toolId))) {
        return this.recordedStep(stepId, kind, fn, params, known);
      }
      // journaled as another kind of step: BeginStep below answers why that is refused (and a
      // journal too large to read whole is asked about step by step, with BeginStep)
    }
    const begin = await this.client.call(this.client.saga, "beginStep", {
      lease: this.lease,
      stepId,
      stepType: STEP_TYPES[kind],
      toolId: options.toolId ?? "",
      toolParams: options.toolId || Object.keys(params).length > 0 ? params : undefined,
    });
    const action = ACTIONS[begin.action] ?? "execute";
    this.met(stepId, action);
    if (action === "skip") return (begin.step?.result ?? {}) as Json;
    const call = this.stepCall(stepId, begin.idempotencyKey, options.toolId ?? "", params, action === "retry");
    let result: Json;
    let cmd: CompensationCommand | null | undefined;
    try {
      result = asResult(await fn(call), stepId);
      const comp = options.compensation;
      cmd = typeof comp === "function" ? comp(result) : comp;
    } catch (err) {
      // a park (RunParked) leaves the step pending on purpose, as a stop does: the attempt after
      // the wait ends runs it again and finds the wait's outcome
      if (!this.signal.aborted && !unwinding(err)) {
        await this.client
          .call(this.client.saga, "failStep", { lease: this.lease, stepId, error: describe(err) })
          .catch(() => undefined); // the error that matters is fn's
      }
      throw err;
    }
    await this.client.call(this.client.saga, "completeStep", {
      lease: this.lease,
      stepId,
      result,
      compensationCmd: cmd ? { toolId: String(cmd.toolId), params: cmd.params ?? {}, reason: cmd.reason ?? "" } : undefined,
    });
    return result;
  }

  /** This step's journal entry from an earlier attempt, if any (the journal is read once). */
  private async known(stepId: string): Promise<SagaStep | undefined> {
    if (this.journal === undefined) {
      try {
        const resp = await this.client.call(this.client.saga, "getJournal", { runId: this.runId });
        this.journal = new Map(resp.steps.map((s) => [s.stepId, s]));
        this.replay = new ReplayCheck(this.runId, resp.steps);
      } catch (err) {
        if (!(err instanceof AwooopError) || err.reason !== JOURNAL_TOO_LARGE) throw err;
        this.journalTooLarge = true;
        return undefined;
      }
    }
    return this.journal.get(stepId);
  }

  /** A step without side effects: skipped when completed, else run and journaled once (RecordStep). */
  private async recordedStep(
    stepId: string,
    kind: StepKind,
    fn: StepFn,
    params: Json,
    known: SagaStep | undefined,
  ): Promise<Json> {
    if (known?.status === StepStatus.STEP_STATUS_COMPLETED) {
      this.met(stepId, "skip");
      return (known.result ?? {}) as Json;
    }
    const action: metrics.StepAction = known !== undefined ? "retry" : "execute";
    this.met(stepId, action);
    const call = this.stepCall(stepId, `${this.runId}:${stepId}`, "", params, action === "retry");
    const base = {
      lease: this.lease,
      stepId,
      stepType: STEP_TYPES[kind],
      params: Object.keys(params).length > 0 ? params : undefined,
    };
    let result: Json;
    try {
      result = asResult(await fn(call), stepId);
    } catch (err) {
      if (!this.signal.aborted && !unwinding(err)) {
        await this.record({ ...base, error: describe(err) }).catch(() => undefined);
      }
      throw err;
    }
    const resp = await this.record({ ...base, result, error: "" });
    return resp.recorded ? result : ((resp.step?.result ?? {}) as Json); // the first recorded result stands
  }

  private async record(request: {
    lease: LeaseToken;
    stepId: string;
    stepType: StepType;
    params: Json | undefined;
    result?: Json;
    error: string;
  }) {
    const resp = await this.client.call(this.client.saga, "recordStep", request);
    if (this.journal !== undefined && resp.step !== undefined) this.journal.set(request.stepId, resp.step);
    return resp;
  }

  private stepCall(stepId: string, idempotencyKey: string, toolId: string, params: Json, retry: boolean): StepCall {
    return {
      runId: this.runId,
      projectId: this.projectId,
      stepId,
      idempotencyKey,
      toolId,
      params,
      attempt: this.attempt,
      retry,
      signal: this.signal,
    };
  }

  // --- progress events ---

  /**
   * Appends a progress event to the run's log for whoever watches the run (WatchRun, the SSE
   * stream, `watchRun`, `awooop runs watch`) and returns its offset. Fenced by the lease: a worker
   * that lost it gets LeaseLost and nothing is written. Without `key` an emit is at-least-once (a
   * handler that runs again emits again; each event carries its attempt); with a `key` unique per
   * run a repeat adds nothing and returns the first event's offset. Past the run's bounds an
   * AwooopError RUN_EVENTS_EXHAUSTED.
   */
  async emit(data: Json = {}, options: { kind?: string; key?: string } = {}): Promise<number> {
    this.live("emit");
    await this.tokens.checkpoint(); // the tokens before the event come before it in the log
    const resp = await this.client.call(this.client.scheduler, "emitEvent", {
      lease: this.lease,
      kind: options.kind ?? "",
      data,
      key: options.key ?? "",
    });
    return resp.offset;
  }

  // --- token streams (tokens.ts) ---

  /**
   * Publishes one token of partial output (an LLM's token) to the run's watchers: live within a
   * few ms (batched), durable with the next checkpoint (every so many tokens or ms, before each
   * ctx.emit, and before the run ends). Tokens are numbered per attempt and stream from 1. Fenced
   * by the lease (LeaseLost). Resolves at once unless a batch is due.
   */
  async streamToken(text: string, options: { stream?: string } = {}): Promise<void> {
    this.live("streamToken");
    await this.tokens.token(text, options.stream ?? DEFAULT_STREAM);
  }

  /** Sends every stream's pending tokens and writes them as a durable checkpoint now. */
  async flushTokens(): Promise<void> {
    this.live("flushTokens");
    await this.tokens.checkpoint();
  }

  /** Streams each chunk of an async iterable (an LLM client's stream), checkpoints, returns the whole text. */
  async pipeTokens(chunks: AsyncIterable<string>, options: { stream?: string } = {}): Promise<string> {
    this.live("pipeTokens");
    return this.tokens.pipe(chunks, options.stream ?? DEFAULT_STREAM);
  }

  // --- approvals ---

  /**
   * Journaled approval. Resolves granted when this approval was already given (the run was approved
   * and claimed again); otherwise asks for it: the lease is released, the run waits in
   * WAITING_APPROVAL, and the returned token must reach the approver. Reject or expiry fails the run
   * and compensates it; approval resumes it and the handler runs again from the top, completed
   * steps skipped, and this call then resolves granted. `ttl` in seconds (default: the server's, 15 min).
   */
  async requestApproval(summary: string, options: { stepId?: string; ttl?: number } = {}): Promise<Approval> {
    const stepId = options.stepId ?? "approval";
    return this.traced("awooop.worker.approval", { "awooop.step_id": stepId }, async (span) => {
      const approval = await this.untracedApproval(summary, stepId, options.ttl);
      span?.setAttribute("awooop.approved", approval.granted);
      return approval;
    });
  }

  /** requestApproval without its span. */
  private async untracedApproval(summary: string, stepId: string, ttl: number | undefined): Promise<Approval> {
    this.live("requestApproval");
    await this.reach(stepId, StepType.STEP_TYPE_APPROVAL_REQUEST);
    const begin = await this.client.call(this.client.saga, "beginStep", {
      lease: this.lease,
      stepId,
      stepType: StepType.STEP_TYPE_APPROVAL_REQUEST,
      toolId: "",
    });
    const action = ACTIONS[begin.action] ?? "execute";
    this.met(stepId, action);
    if (action === "skip") {
      return { granted: true, token: "", decidedBy: String(begin.step?.result?.decided_by ?? "") };
    }
    if (action === "retry" && (await this.approvedSince(begin.step?.startedAt))) {
      const decidedBy = this.run.approvalDecidedBy;
      await this.client.call(this.client.saga, "completeStep", {
        lease: this.lease,
        stepId,
        result: { approved: true, decided_by: decidedBy },
      });
      return { granted: true, token: "", decidedBy };
    }
    const resp = await this.ending("waiting_approval", () =>
      this.client.call(this.client.scheduler, "requestApproval", {
        lease: this.lease,
        summary,
        ttl: duration(ttl),
      }),
    );
    return { granted: false, token: resp.approvalToken, expiresAt: resp.expiresAt, decidedBy: "" };
  }

  /**
   * Was the run approved after this approval step was first journaled? (A pending approval step is
   * also what a crash between BeginStep and RequestApproval leaves behind.) Timestamps arrive as
   * Dates (milliseconds): an approval in the very millisecond the step began counts.
   */
  private async approvedSince(startedAt: Date | undefined): Promise<boolean> {
    if (!this.run.approvalDecidedBy) return false;
    const history = await this.client.call(this.client.scheduler, "getRunHistory", { runId: this.runId });
    const since = startedAt?.getTime() ?? 0;
    return history.events.some(
      (e) =>
        e.fromStatus === RunStatus.RUN_STATUS_WAITING_APPROVAL &&
        e.toStatus === RunStatus.RUN_STATUS_RESUMED &&
        (e.at?.getTime() ?? 0) >= since,
    );
  }

  // --- waiting on a slow tool ---

  /**
   * `await ctx.waitTool("tool", async () => ...)`: the run is WAITING_TOOL while fn runs (the lease
   * is still renewed), RUNNING again after it, also when fn throws.
   */
  async waitTool<T>(toolId: string, fn: () => Promise<T>): Promise<T> {
    this.live("waitTool");
    await this.client.call(this.client.scheduler, "waitTool", { lease: this.lease, toolId });
    let value: T;
    try {
      value = await fn();
    } catch (err) {
      if (!(err instanceof LeaseLost) && this.outcome === undefined && !this.signal.aborted) {
        await this.client.call(this.client.scheduler, "resumeTool", { lease: this.lease }).catch(() => undefined);
      }
      throw err;
    }
    if (this.outcome === undefined) await this.client.call(this.client.scheduler, "resumeTool", { lease: this.lease });
    return value;
  }

  // --- durable waits (docs/worker-sdk.md "Durable waits"; the Python SDK's waits.py) ---
  //
  // A run that waits does not keep its handler running: `await ctx.wait(token)` on an open wait
  // parks the run (WAITING_TOOL without a lease: no worker slot, no heartbeat) and throws
  // RunParked, which the Worker catches. When the wait ends the run is claimable again; a worker
  // runs the handler from the top, finished steps skip, createWait finds the same wait by its
  // step id, and wait() returns its outcome at once. Each is journaled as a callback step:
  // `<stepId>` when the wait is created, `<stepId>:outcome` when the handler received its outcome.

  private waitStepId(kind: string, stepId: string | undefined): string {
    if (stepId) return stepId;
    const n = (this.waitNumbers.get(kind) ?? 0) + 1;
    this.waitNumbers.set(kind, n);
    return `${kind}-${n}`;
  }

  /**
   * A wait token any system completes: `token.callbackUrl` (POST a JSON object) or the CompleteWait
   * RPC with `token.waitId`. It times out after `timeout` seconds. On a later attempt the same call
   * (same stepId, or the same place in call order) finds the same wait.
   */
  async createWait(timeout: number, options: { stepId?: string } = {}): Promise<WaitToken> {
    this.live("createWait");
    return this.newWait(timeout, this.waitStepId("wait", options.stepId), WaitKind.WAIT_KIND_TOKEN);
  }

  /**
   * The completion's result. While the wait is open the run parks (no lease, no worker slot) and
   * this throws RunParked: the handler unwinds, and runs again from the top once the wait ends, when
   * this call resolves at once. Throws WaitTimeout when the wait timed out instead.
   */
  async wait(token: WaitToken): Promise<Json> {
    this.live("wait");
    const [completed, result] = await this.waitOutcome(token);
    if (!completed) throw new WaitTimeout(token.stepId, token.waitId);
    return result;
  }

  /** A durable sleep: the run parks until `seconds` have passed since the first attempt that reached this call. */
  async sleep(seconds: number, options: { stepId?: string } = {}): Promise<void> {
    this.live("sleep");
    const token = await this.newWait(seconds, this.waitStepId("sleep", options.stepId), WaitKind.WAIT_KIND_SLEEP);
    await this.waitOutcome(token);
  }

  /**
   * The first channel event that `match` names (eventMatches.ts: an API event's correlation key, a
   * string or `{ channel: "api", correlationKey: K }`; a Telegram message in the same chat,
   * `{ channel: "telegram", chatId: C }`; an Alertmanager resolve of the same group,
   * `{ channel: "alertmanager", groupKey: G }`) that arrived at most `lookback` seconds (default
   * 300) before this wait was first created, or later: `{ run_id, provider_event_id, payload,
   * arrived_at }`. The run parks until it arrives (matched by the scheduler's wait sweep) and this
   * throws RunParked; the handler runs again once it did, and this resolves with the event. Throws
   * WaitTimeout when none came in `timeout` seconds, and a TypeError for a malformed match before
   * anything is sent. Step ids default to `event-1`, `event-2`, ... in call order.
   */
  async waitForEvent(
    match: EventMatch,
    options: { timeout: number; lookback?: number; stepId?: string },
  ): Promise<Json> {
    this.live("waitForEvent");
    const [channel, correlationKey] = keyOf(match);
    const stepId = this.waitStepId("event", options.stepId);
    const token = await this.newWait(options.timeout, stepId, WaitKind.WAIT_KIND_EVENT, {
      matchChannel: MATCH_CHANNELS[channel],
      correlationKey,
      lookback: options.lookback ?? 300,
    });
    return this.wait(token);
  }

  // --- parked tool calls ---

  /**
   * A tool that completes later, without holding this worker: a journaled tool_call step that
   * creates a wait (`<stepId>:wait`), starts the tool through the gateway with the wait's callback
   * URL (ExecuteTool `callbackUrl`, under the step's idempotency key) and parks the run
   * (WAITING_TOOL, no lease; this throws RunParked). The tool posts its outcome to the URL; the run
   * resumes, the handler runs again from the top, and this call resolves with the posted result and
   * completes the step (with its compensation, as `step` does). On any later attempt the completed
   * step skips: the tool is not called again. Throws WaitTimeout when nothing was posted within
   * `timeout` seconds and ParkedToolFailed when the tool posted an error. The gateway is the
   * worker's (`gateway` option, else AWOOOP_GATEWAY_ADDR).
   */
  async callToolParked(toolId: string, params: Json | undefined, options: ParkedToolOptions): Promise<Json> {
    this.live("callToolParked");
    const sid = this.waitStepId("tool", options.stepId);
    const startAndPark = async (call: StepCall): Promise<Json> => {
      const token = await this.newWait(options.timeout, `${sid}:wait`, WaitKind.WAIT_KIND_TOKEN);
      // the wait is open and this attempt holds its token: (re)start the tool with it
      if (token.callbackUrl) await this.startTool(call, token);
      return toolResult(sid, await this.wait(token));
    };
    return this.step(sid, startAndPark, { toolId, params: params ?? {}, compensation: options.compensation });
  }

  /**
   * Starts a parked tool call's tool (ExecuteTool with the wait's callback URL). The gateway
   * de-duplicates by the step's idempotency key: a repeat (this attempt's predecessor died before it
   * parked) runs nothing again and redirects the outcome to the new URL. A gateway that ran the tool
   * at once instead (accepted false) answered its result: it completes the wait here, so the run
   * goes on without parking.
   */
  private async startTool(call: StepCall, token: WaitToken): Promise<void> {
    const resp = await this.client.call(this.client.gateway, "executeTool", {
      toolId: call.toolId,
      params: call.params,
      idempotencyKey: call.idempotencyKey,
      projectId: call.projectId,
      runId: call.runId,
      reason: `step ${call.stepId} (attempt ${call.attempt}), parked`,
      callbackUrl: token.callbackUrl,
    });
    if (!resp.accepted) {
      await this.client.call(this.client.scheduler, "completeWait", {
        waitId: token.waitId,
        result: { result: resp.result ?? {} },
      });
    }
  }

  private async newWait(
    timeout: number,
    stepId: string,
    kind: WaitKind,
    event: { matchChannel: ChannelType; correlationKey: string; lookback: number } = {
      matchChannel: ChannelType.CHANNEL_TYPE_UNSPECIFIED,
      correlationKey: "",
      lookback: 0,
    },
  ): Promise<WaitToken> {
    await this.reach(stepId, StepType.STEP_TYPE_CALLBACK, "", undefined, false);
    const resp = await this.client.call(this.client.scheduler, "createWait", {
      lease: this.lease,
      stepId,
      kind,
      timeout: duration(timeout),
      matchChannel: event.matchChannel,
      correlationKey: event.correlationKey,
      lookback: duration(event.lookback),
    });
    const w = resp.wait;
    if (w === undefined) throw new Error(`CreateWait answered no wait for ${stepId}`);
    const token: WaitToken = {
      waitId: w.waitId,
      stepId,
      expiresAt: w.expiresAt,
      token: resp.token,
      callbackUrl: resp.callbackUrl,
    };
    if (resp.created) {
      await this.record({
        lease: this.lease,
        stepId,
        stepType: StepType.STEP_TYPE_CALLBACK,
        params: undefined,
        result: { wait_id: w.waitId, kind: WAIT_KIND_NAMES[kind] ?? "", expires_at: w.expiresAt?.toISOString() ?? "" },
        error: "",
      });
    }
    return token;
  }

  /** [completed, result] of the wait; parks the run (throwing RunParked) while it is open. */
  private async waitOutcome(token: WaitToken): Promise<[boolean, Json]> {
    const stepId = `${token.stepId}:outcome`;
    await this.reach(stepId, StepType.STEP_TYPE_CALLBACK, "", undefined, false);
    const known = await this.known(stepId);
    if (known?.status === StepStatus.STEP_STATUS_COMPLETED) {
      this.actions[stepId] = "skip";
      const recorded = (known.result ?? {}) as Json;
      return [recorded.outcome === "completed", (recorded.result ?? {}) as Json];
    }
    // marked as leaving our hands while the call is in flight (the worker neither renews nor
    // stops it meanwhile); a refused call unmarks it
    const resp = await this.ending("parked", () =>
      this.client.call(this.client.scheduler, "awaitWait", { lease: this.lease, waitId: token.waitId }),
    );
    if (resp.parked) throw new RunParked(token.stepId);
    this.outcome = undefined; // the wait had ended: the run is still ours, under the same lease
    const completed = resp.wait?.status === WaitStatus.WAIT_STATUS_COMPLETED;
    const result = completed ? ((resp.wait?.result ?? {}) as Json) : {};
    this.actions[stepId] = "execute";
    await this.record({
      lease: this.lease,
      stepId,
      stepType: StepType.STEP_TYPE_CALLBACK,
      params: undefined,
      result: { outcome: completed ? "completed" : "timed_out", result, by: resp.wait?.completedBy ?? "" },
      error: "",
    });
    return [completed, result];
  }

  // --- child runs ---

  /**
   * Starts a child run of this run's project (or finds the one an earlier attempt started under the
   * same stepId: `child-1`, `child-2`, ... in call order when not given) and returns its handle at
   * once; `await handle.result()` parks this run until the child has ended (its wait's step id is
   * `<stepId>:wait`).
   */
  async startChild(input: Json = {}, options: Omit<Child, "input"> = {}): Promise<ChildHandle> {
    this.live("startChild");
    const stepId = this.waitStepId("child", options.stepId);
    await this.reach(stepId, StepType.STEP_TYPE_CALLBACK, "", undefined, false);
    const spec = childSpec({ ...options, input }, stepId);
    // the child's trace hangs under this span (StartChildRuns stores the call's context with it)
    const resp = await this.traced("awooop.worker.start_child", { "awooop.step_id": stepId }, () =>
      this.client.call(this.client.scheduler, "startChildRuns", {
        lease: this.lease,
        children: [spec],
        waitStepId: "",
        failFast: false,
      }),
    );
    const [c] = resp.children;
    if (c === undefined) throw new Error(`StartChildRuns answered no child for ${stepId}`);
    if (c.started) {
      metrics.CHILDREN_STARTED.inc();
      await this.journalChildren(stepId, [c.runId]);
    }
    const waitStepId = `${stepId}:wait`;
    return {
      runId: c.runId,
      stepId,
      started: c.started,
      result: async (opts = {}) => {
        this.live("result");
        const [outcome] = await this.traced("awooop.worker.child_result", { "awooop.step_id": waitStepId }, () =>
          this.childOutcomes([spec], waitStepId, false, opts.timeout),
        );
        return outcome as ChildOutcome;
      },
    };
  }

  /**
   * Starts the children in one call and parks this run until all of them have ended (RunParked: the
   * handler unwinds and runs again from the top when they have, and this call then resolves at once
   * with each child's outcome, in order). failFast: the wait ends at the first child that does not
   * complete, and its unfinished siblings are cancelled. Throws ChildrenTimeout when they did not
   * all end in `timeout` seconds. Step ids: `children-1`, ... for the wait, `child-1`, ... for the
   * children, in call order, unless given.
   */
  async runChildren(
    children: Child[],
    options: { failFast?: boolean; stepId?: string; timeout?: number } = {},
  ): Promise<ChildOutcome[]> {
    this.live("runChildren");
    const waitStepId = this.waitStepId("children", options.stepId);
    await this.reach(waitStepId, StepType.STEP_TYPE_CALLBACK, "", undefined, false);
    const specs = children.map((c) => childSpec(c, this.waitStepId("child", c.stepId)));
    const attributes = { "awooop.step_id": waitStepId, "awooop.children": specs.length };
    return this.traced("awooop.worker.run_children", attributes, () =>
      this.childOutcomes(specs, waitStepId, options.failFast ?? false, options.timeout, true),
    );
  }

  /**
   * Journals that this run started children here (a callback step, as a durable wait's creation
   * is), so a replay knows its code went this far (replay.ts).
   */
  private async journalChildren(stepId: string, runIds: string[]): Promise<void> {
    await this.record({
      lease: this.lease,
      stepId,
      stepType: StepType.STEP_TYPE_CALLBACK,
      params: undefined,
      result: { children: runIds },
      error: "",
    });
  }

  /**
   * StartChildRuns with the wait over specs: the children's outcomes once the wait has ended (the
   * children are read again when it ended while this attempt asked to park), RunParked while open.
   */
  private async childOutcomes(
    specs: ChildRunSpec[],
    waitStepId: string,
    failFast: boolean,
    timeout: number | undefined,
    journal = false,
  ): Promise<ChildOutcome[]> {
    const request = { lease: this.lease, children: specs, waitStepId, failFast, timeout: duration(timeout) };
    let resp = await this.client.call(this.client.scheduler, "startChildRuns", request);
    const started = resp.children.filter((c) => c.started).length;
    if (started > 0) {
      metrics.CHILDREN_STARTED.inc(started);
      if (journal) await this.journalChildren(waitStepId, resp.children.map((c) => c.runId));
    }
    let w = resp.wait;
    if (w === undefined) throw new Error(`StartChildRuns answered no wait for ${waitStepId}`);
    if (w.status === WaitStatus.WAIT_STATUS_OPEN) {
      const waitId = w.waitId;
      const parked = await this.ending("parked", () =>
        this.client.call(this.client.scheduler, "awaitWait", { lease: this.lease, waitId }),
      );
      if (parked.parked) throw new RunParked(waitStepId);
      this.outcome = undefined; // the children ended meanwhile: the run is still ours
      w = parked.wait ?? w;
      resp = await this.client.call(this.client.scheduler, "startChildRuns", { ...request, waitStepId: "" });
    }
    if (w.status === WaitStatus.WAIT_STATUS_TIMED_OUT) throw new ChildrenTimeout(waitStepId, w.waitId);
    const outcomes: ChildOutcome[] = [];
    for (const c of resp.children) outcomes.push(outcomeOf(c, await this.childOutput(c)));
    this.actions[waitStepId] = "children";
    for (const o of outcomes) if (o.ended) metrics.CHILDREN_ENDED.inc({ status: o.status });
    return outcomes;
  }

  /** A child's output: from StartChildRuns' answer, or read with GetRun when it did not fit there. */
  private async childOutput(c: ChildRun): Promise<Json> {
    if (!c.outputOmitted) return (c.output ?? {}) as Json;
    const got = await this.client.call(this.client.scheduler, "getRun", { runId: c.runId });
    return (got.run?.output ?? {}) as Json;
  }

  // --- the run's end ---

  /**
   * Marks the run as leaving the handler's hands while the ending call is in flight (the worker
   * then neither renews nor stops it). If the call is refused, the run is still ours: unmark it so
   * the worker can fail it, hand it back or honour a cancel as usual.
   */
  private async ending<T>(outcome: string, end: () => Promise<T>): Promise<T> {
    this.outcome = outcome;
    try {
      return await end();
    } catch (err) {
      if (!(err instanceof LeaseLost)) this.outcome = undefined;
      throw err;
    }
  }

  /** RUNNING -> COMPLETED with output. (Returning an object from the handler does the same.) */
  /**
   * Holds the run (HoldRun): PENDING, claimed by nobody, the attempt not counted, until an
   * operator's UnholdRun (after deploying code that replays its journal) or CancelRun (which
   * compensates it). The worker does this when the handler's code does not replay the journal.
   */
  async hold(reason: string, errorCode = NONDETERMINISM_CODE): Promise<Run> {
    if (this.outcome !== undefined) throw new RunFinished(`hold: run ${this.runId} already ${this.outcome}`);
    return this.ending("held", async () => {
      const resp = await this.client.call(this.client.scheduler, "holdRun", {
        lease: this.lease,
        reason: reason.slice(0, 4096),
        errorCode: errorCode.slice(0, 64),
      });
      return resp.run as Run;
    });
  }

  /**
   * Whether this run takes the path of the code change `changeId`: true for a run that reaches
   * this call on code that has it (its first attempt, or a replay past everything journaled),
   * false for a run whose earlier attempt went past this point under the code before the change.
   * The answer is journaled (step `patch:<changeId>`), so every later attempt gets the same one.
   * Once `awooop builds patches` shows no unfinished run on the old path, delete it and the call.
   */
  async patched(changeId: string): Promise<boolean> {
    this.live("patched");
    if (!/^[\x21-\x7e]{1,120}$/.test(changeId)) throw new TypeError("changeId: 1-120 printable ASCII characters without spaces");
    const cached = this.patches.get(changeId);
    if (cached !== undefined) return cached;
    const stepId = PATCH_PREFIX + changeId;
    const first = this.journal !== undefined && this.replay === undefined; // a first attempt: nothing to replay
    const known = first || this.journalTooLarge ? undefined : await this.known(stepId);
    let answer: boolean;
    if (known?.status === StepStatus.STEP_STATUS_COMPLETED) {
      answer = Boolean(known.result?.patched);
    } else {
      // a first attempt; or a journal too large to read: an earlier attempt's marker, if any, answers below
      answer = this.replay !== undefined ? this.replay.atFrontier() : first;
      const resp = await this.record({
        lease: this.lease,
        stepId,
        stepType: StepType.STEP_TYPE_CALLBACK,
        params: undefined,
        result: { patched: answer },
        error: "",
      });
      if (!resp.recorded) answer = Boolean(resp.step?.result?.patched); // an earlier attempt's marker stands
    }
    this.patches.set(changeId, answer);
    this.actions[stepId] = answer ? "patched" : "unpatched";
    return answer;
  }

  async complete(output: Json = {}): Promise<Run> {
    this.live("complete");
    this.checkReplayed();
    await this.tokens.checkpoint(); // the run's log holds its whole streamed output
    this.tokens.close();
    const request = { lease: this.lease, output };
    return this.ending("completed", async () => {
      if (this.completions !== undefined) return this.completions.complete(request);
      const resp = await this.client.call(this.client.scheduler, "completeRun", request);
      return resp.run as Run;
    });
  }

  /**
   * Fails this attempt: retryable with attempts left -> PENDING again after a backoff (retryAfter
   * seconds, else the run's retry policy's); otherwise FAILED, and the saga compensates completed steps.
   */
  async fail(
    reason: string,
    options: { retryable?: boolean; errorCode?: string; retryAfter?: number } = {},
  ): Promise<Run> {
    this.live("fail");
    await this.tokens.checkpoint().catch(() => undefined); // what was streamed stays readable; the failure matters more
    this.tokens.close();
    return this.ending("failed", async () => {
      const resp = await this.client.call(this.client.scheduler, "failRun", {
        lease: this.lease,
        reason: reason.slice(0, 4096),
        errorCode: (options.errorCode ?? "").slice(0, 64),
        retryable: options.retryable ?? false,
        retryAfter: duration(options.retryAfter),
      });
      return resp.run as Run;
    });
  }
}

/** Errors that unwind a step without being its failure: the lease is gone, the run ended or parked. */
function unwinding(err: unknown): boolean {
  return err instanceof LeaseLost || err instanceof RunFinished || err instanceof RunParked;
}

/**
 * The result a parked tool call's tool posted: `{ result: {...} }`, or `{ error, code }`
 * (ParkedToolFailed); a body with neither key is the result itself.
 */
export function toolResult(stepId: string, posted: Json): Json {
  if ("error" in posted && !("result" in posted)) {
    throw new ParkedToolFailed(stepId, String(posted.error), posted.code ? String(posted.code) : "");
  }
  const result = "result" in posted ? posted.result : posted;
  if (result === null || typeof result !== "object" || Array.isArray(result)) {
    const kind = result === null ? "null" : Array.isArray(result) ? "array" : typeof result;
    throw new ParkedToolFailed(stepId, `posted result is not an object: ${kind}`);
  }
  return result as Json;
}

/** `Type: message` of a thrown value, as the journal and FailRun record it. */
export function describe(err: unknown): string {
  const text = err instanceof Error ? `${err.name}: ${err.message}` : `Error: ${String(err)}`;
  return text.slice(0, 4096);
}

function asResult(value: unknown, stepId: string): Json {
  if (value === null || value === undefined) return {};
  if (typeof value === "object" && !Array.isArray(value)) return value as Json;
  throw new TypeError(`step ${stepId} must return an object (or nothing), not ${Array.isArray(value) ? "an array" : typeof value}`);
}

/** The handler: runs once per claim; its returned object (or nothing) completes the run. */
export type Handler = (ctx: RunContext) => Promise<Json | null | undefined | void>;
