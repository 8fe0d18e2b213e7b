// Worker: claims runs, keeps their leases alive, runs a handler per run, and stops cleanly, with
// the Python SDK's semantics (sdk/awooop/worker/worker.py; docs/worker-sdk.md):
// - Claiming: one ClaimRuns long-poll at a time for as many runs as there are free slots
//   (`concurrency`), each claim with a claim id kept across its retries (claimIds.ts).
// - Leases: one background loop sends ONE Heartbeat for every held lease each
//   `heartbeatInterval`. A lease reported LEASE_LOST stops its handler at once (ctx.signal aborts);
//   a reported cancel request stops it and then acknowledges the cancel (-> CANCELLED). If
//   heartbeats keep failing until the lease must have expired, the handler is stopped too.
// - Ending a run: the handler's returned object completes the run (batched CompleteRuns calls);
//   an uncaught error fails the attempt as retryable (E-WORKER-HANDLER).
// - Shutdown (SIGTERM, SIGINT or stop()): stop claiming, give handlers `shutdownGrace` seconds
//   (from the stop) to finish (ctx.stopping aborts), then stop the rest and hand their leases back
//   with ReleaseRun (PENDING again at once, the attempt not counted). Settling calls that end
//   UNAVAILABLE / DEADLINE_EXCEEDED are sent again (settling.ts). A ClaimRuns in flight at the
//   stop is not cancelled (its runs may be claimed already): its answer is awaited and its runs
//   handed back unstarted. Runs that could not be settled are logged and run() rejects with a
//   WorkerError naming them.
// - Observability: the Python SDK's awooop_worker_* Prometheus metrics (metrics.ts), a span per run
//   and per step (tracing.ts), and optionally /metrics and /healthz over HTTP (health.ts).
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { status as Code } from "@grpc/grpc-js";
import { ROOT_CONTEXT, context, trace, type Tracer, type TracerProvider } from "@opentelemetry/api";
import type { Registry } from "prom-client";
import { Client, DEFAULT_TIMEOUT, type ClientOptions } from "./client";
import { ClaimIds } from "./claimIds";
import { CompletionBatcher, type PendingCompletion } from "./completions";
import { describe, RunContext, type Handler, type Json, type StopReason } from "./context";
import { AwooopError, LeaseLost, RunFinished, RunParked, WAIT_TIMED_OUT_CODE, WaitTimeout, WorkerError } from "./errors";
import { LeaseOutcome, type ClaimedRun, type ClaimRunsResponse } from "./gen/awooop/scheduler/v1/scheduler";
import { HealthServer, type Health } from "./health";
import * as metrics from "./metrics";
import { Nondeterminism } from "./replay";
import { workerBuild, workerHttpPort, workerLabels } from "./settings";
import * as settling from "./settling";
import { startRunSpan, tracerOf, untraced } from "./tracing";
import { aborted, duration, now, sleep, within } from "./time";

// errors no retry will fix: the worker stops instead of spinning
const FATAL_CODES: readonly Code[] = [Code.UNAUTHENTICATED, Code.PERMISSION_DENIED, Code.INVALID_ARGUMENT];
const HEARTBEAT_BATCH = 1000; // the scheduler's limit per Heartbeat call

export type LogLevel = "debug" | "info" | "warn" | "error";
/** Where the worker logs; the default writes one JSON line per event to stderr. */
export type Logger = (level: LogLevel, message: string, fields?: Record<string, unknown>) => void;

export const jsonLogger: Logger = (level, message, fields = {}) => {
  process.stderr.write(`${JSON.stringify({ time: new Date().toISOString(), level, message, ...fields })}\n`);
};

export interface WorkerOptions extends ClientOptions {
  /** Projects to claim from; the key needs the worker role in each. */
  projects: string[];
  /** Recorded on the run as worker_id; default `<hostname>-<pid>-<random>`. */
  workerId?: string;
  /** The build of this worker's code (docs/versioning.md); default AWOOOP_WORKER_BUILD, else none. */
  buildId?: string;
  /**
   * What this worker offers runs that require or prefer labels (docs/flow-control.md, "Worker
   * labels"); default AWOOOP_WORKER_LABELS (key=value,key=value), else none.
   */
  labels?: Record<string, string>;
  /** Runs handled at once (default 4). */
  concurrency?: number;
  /** Lease asked for in seconds (default: the scheduler's, AWOOOP_LEASE_TTL). */
  leaseTtl?: number;
  /** Seconds between heartbeats (default min(30, leaseTtl / 3)); shorter than leaseTtl. */
  heartbeatInterval?: number;
  /** Long-poll wait of ClaimRuns in seconds (default 20); also the longest an idle worker takes to stop. */
  claimWait?: number;
  /** Deadline of every call in seconds (default 10; ClaimRuns: claimWait + this). */
  callTimeout?: number;
  /** Seconds handlers get to finish after a stop (default 20). */
  shutdownGrace?: number;
  logger?: Logger;
  /** An open Client to use (its addresses, key and timeout) instead of opening one. */
  client?: Client;
  /** Where the awooop_worker_* metrics are registered (default: prom-client's default registry). */
  registry?: Registry;
  /** Spans go to this provider (default: the global one; without an OpenTelemetry SDK, none). */
  tracerProvider?: TracerProvider;
  /** Serve /metrics and /healthz on this port while run() runs (default AWOOOP_WORKER_HTTP_PORT, else none; 0: any free port). */
  httpPort?: number;
  /** The address that HTTP server listens on (default every interface). */
  httpHost?: string;
}

export interface WorkerStats {
  claimed: number;
  completed: number;
  failed: number;
  waitingApproval: number;
  /** Runs parked on a durable wait (ctx.wait, ctx.sleep): released, no longer held. */
  parked: number;
  lost: number;
  cancelled: number;
  released: number;
  /** Runs held for an operator: the handler's code did not replay their journal (HoldRun). */
  held: number;
  errors: number;
  /** Heartbeat calls, and the leases they renewed. */
  heartbeatsSent: number;
  leasesRenewed: number;
  /** ClaimRuns calls, those that failed after the channel's retries, and long-polls answered empty early. */
  claimsSent: number;
  claimErrors: number;
  earlyEmptyClaims: number;
  /** CompleteRuns calls (completions that finish while one is in flight share the next). */
  completeRunsCalls: number;
  /** Completions carried by a ClaimRuns (a full worker's finished runs ride on its next claim). */
  completionsCarried: number;
}

type Outcome =
  | "completed"
  | "failed"
  | "waitingApproval"
  | "parked"
  | "lost"
  | "cancelled"
  | "released"
  | "held"
  | "errors";
const OUTCOMES: Readonly<Record<string, Outcome>> = {
  completed: "completed",
  failed: "failed",
  waiting_approval: "waitingApproval",
  parked: "parked",
};

// the metric's label of each outcome (the Python SDK's names)
const OUTCOME_LABELS: Readonly<Record<Outcome, metrics.RunOutcome>> = {
  completed: "completed",
  failed: "failed",
  waitingApproval: "waiting_approval",
  parked: "parked",
  lost: "lost",
  cancelled: "cancelled",
  released: "released",
  held: "held",
  errors: "error",
};

interface Held {
  ctx: RunContext;
  ttl: number; // lease length in seconds, as granted
  renewedUntil: number; // monotonic time by which the lease surely ends without a renewal
  done: Promise<void>; // the run is settled (or its settling gave up)
  stopReason?: StopReason;
  handlerDone: boolean; // the handler returned or threw: the run is being ended, never stopped
  settled: boolean; // ended, handed back or no longer ours
}

export function defaultWorkerId(): string {
  return `${hostname()}-${process.pid}-${randomBytes(2).toString("hex")}`.slice(-128);
}

/**
 * Runs `handler(ctx)` for each run claimed from `projects`.
 *
 *   await new Worker(async (ctx) => ({ ok: true }), { projects: ["demo"] }).run(); // until SIGTERM / SIGINT / stop()
 */
export class Worker {
  readonly workerId: string;
  /** The build this worker declares in its claims ("" declares none). */
  readonly buildId: string;
  /** The labels this worker declares in its claims. */
  readonly labels: Readonly<Record<string, string>>;
  readonly projects: readonly string[];
  readonly client: Client;
  private readonly counts: Omit<WorkerStats, "completeRunsCalls" | "completionsCarried"> = {
    claimed: 0,
    completed: 0,
    failed: 0,
    waitingApproval: 0,
    parked: 0,
    lost: 0,
    cancelled: 0,
    released: 0,
    held: 0,
    errors: 0,
    heartbeatsSent: 0,
    leasesRenewed: 0,
    claimsSent: 0,
    claimErrors: 0,
    earlyEmptyClaims: 0,
  };
  private readonly concurrency: number;
  private readonly leaseTtl: number | undefined;
  private readonly heartbeatInterval: number;
  private readonly claimWait: number;
  private readonly callTimeout: number;
  private readonly shutdownGrace: number;
  private readonly log: Logger;
  private readonly ownClient: boolean;
  private readonly completions: CompletionBatcher;
  private readonly claimIds = new ClaimIds();
  private readonly held = new Map<string, Held>();
  private readonly stopping = new AbortController();
  private slotFreed = new AbortController();
  private awaitingSlot = false; // the claim loop waits for a slot: completions ride on its claim
  private running = false;
  private stoppedAt: number | undefined; // monotonic time of the stop: the grace counts from it
  private inFlightClaim: Promise<ClaimRunsResponse> | undefined; // a claim in flight at the stop
  private readonly returning: Promise<void>[] = []; // hand-backs of runs claimed while stopping
  private readonly unsettled: string[] = []; // "run (attempt n)" of runs neither ended nor handed back
  private readonly tracer: Tracer;
  private readonly registry: Registry | undefined;
  private readonly http: { port: number; host: string | undefined } | undefined;
  private healthServer: HealthServer | undefined;

  constructor(
    private readonly handler: Handler,
    options: WorkerOptions,
  ) {
    this.projects = [...options.projects];
    if (this.projects.length === 0) throw new WorkerError("projects: give at least one project to claim runs from");
    this.concurrency = options.concurrency ?? 4;
    if (!(this.concurrency >= 1)) throw new WorkerError("concurrency must be at least 1");
    this.workerId = options.workerId ?? defaultWorkerId();
    this.buildId = options.buildId ?? workerBuild();
    this.labels = { ...(options.labels ?? workerLabels()) };
    this.leaseTtl = options.leaseTtl;
    this.heartbeatInterval = options.heartbeatInterval ?? Math.min(30, (options.leaseTtl ?? 300) / 3);
    if (options.leaseTtl && this.heartbeatInterval >= options.leaseTtl) {
      throw new WorkerError("heartbeatInterval must be shorter than leaseTtl");
    }
    this.claimWait = options.claimWait ?? 20;
    this.callTimeout = options.callTimeout ?? DEFAULT_TIMEOUT;
    this.shutdownGrace = options.shutdownGrace ?? 20;
    this.log = options.logger ?? jsonLogger;
    this.ownClient = options.client === undefined;
    this.client = options.client ?? new Client({ ...options, timeout: this.callTimeout });
    this.registry = options.registry;
    metrics.registerMetrics(this.registry); // a process with a Worker exports the awooop_worker_* metrics
    this.tracer = tracerOf(options.tracerProvider);
    let httpPort: number | undefined;
    try {
      httpPort = options.httpPort ?? workerHttpPort();
    } catch (err) {
      throw new WorkerError((err as Error).message);
    }
    this.http = httpPort === undefined ? undefined : { port: httpPort, host: options.httpHost };
    this.completions = new CompletionBatcher(this.client);
    this.completions.setCarrier(
      () => this.awaitingSlot && !this.stopping.signal.aborted,
      () => this.slotFreed.abort(),
    );
  }

  /** What the worker did so far. */
  get stats(): WorkerStats {
    return { ...this.counts, completeRunsCalls: this.completions.calls, completionsCarried: this.completions.carried };
  }

  /** Where /metrics and /healthz are served ("host:port") while run() runs; "" when not. */
  get httpAddress(): string {
    return this.healthServer?.address ?? "";
  }

  /** `${runId} (attempt n)` of every lease held now. */
  get leases(): string[] {
    return [...this.held.values()].map((h) => name(h.ctx));
  }

  /** What /healthz answers. */
  private health(): Health {
    return {
      status: this.stopping.signal.aborted ? "draining" : "serving",
      worker_id: this.workerId,
      held: this.held.size,
    };
  }

  /** Asks the worker to stop: no new claims; running handlers finish or are handed back. */
  stop(): void {
    if (this.stopping.signal.aborted) return;
    this.stoppedAt = now();
    this.stopping.abort();
    this.log("info", "worker stopping: no new claims; handlers finish or are handed back", {
      worker_id: this.workerId,
      held: this.held.size,
      grace_s: this.shutdownGrace,
    });
  }

  /**
   * Claims and handles runs until stop(), SIGTERM or SIGINT; then shuts down cleanly. Rejects with
   * a WorkerError for errors no retry fixes (a bad key, no worker role) and when runs held at the
   * stop could not be settled (it names them): exit non-zero then.
   */
  async run(options: { installSignalHandlers?: boolean } = {}): Promise<void> {
    if (this.running) throw new Error("worker already running");
    this.running = true;
    const onSignal = (): void => this.stop();
    const signals: NodeJS.Signals[] = options.installSignalHandlers === false ? [] : ["SIGTERM", "SIGINT"];
    for (const sig of signals) process.on(sig, onSignal);
    if (this.http !== undefined) {
      try {
        this.healthServer = await HealthServer.listen(this.http.port, this.http.host, this.registry, () => this.health());
      } catch (err) {
        for (const sig of signals) process.off(sig, onSignal);
        this.running = false;
        throw new WorkerError(`httpPort ${this.http.port}: ${describe(err)}`);
      }
    }
    const heartbeatsDone = new AbortController();
    // the loops' batched calls belong to no run's trace, whatever span run() was called in
    const heartbeats = untraced(() => this.heartbeatLoop(heartbeatsDone.signal));
    this.log("info", "worker started", {
      worker_id: this.workerId,
      projects: this.projects,
      concurrency: this.concurrency,
      ...(this.healthServer ? { http: this.healthServer.address } : {}),
    });
    let failure: unknown;
    try {
      await untraced(() => this.claimLoop());
    } catch (err) {
      failure = err;
    }
    this.stop(); // also after a fatal error: handlers see ctx.stopping, the grace counts from now
    this.completions.releaseHeld();
    await this.shutdown();
    const unsettled = this.logUnsettled();
    heartbeatsDone.abort();
    await heartbeats;
    for (const sig of signals) process.off(sig, onSignal);
    if (this.ownClient) this.client.close();
    await this.healthServer?.close();
    this.healthServer = undefined;
    this.running = false;
    this.log("info", "worker stopped", { worker_id: this.workerId });
    if (failure !== undefined) throw failure;
    if (unsettled) throw new WorkerError(unsettled);
  }

  // --- claiming ---

  private async claimLoop(): Promise<void> {
    let backoff = 0.2;
    let early = 0; // long-polls in a row answered empty well before their wait
    while (!this.stopping.signal.aborted) {
      // runs whose completion waits for this claim are done: their slots are free
      const free = this.concurrency - this.held.size + this.completions.heldCount;
      if (free <= 0) {
        this.slotFreed = new AbortController();
        this.awaitingSlot = true;
        await Promise.race([aborted(this.slotFreed.signal), aborted(this.stopping.signal)]);
        this.awaitingSlot = false;
        continue;
      }
      const carried = this.completions.take();
      if (carried.length > 0) {
        await this.claimCarrying(carried, free);
        continue;
      }
      const { id, maxRuns } = this.claimIds.next(Math.min(free, 100));
      const sentAt = now();
      this.counts.claimsSent += 1;
      const claim = this.client.call(
        this.client.scheduler,
        "claimRuns",
        {
          workerId: this.workerId,
          projectIds: [...this.projects],
          maxRuns,
          wait: duration(this.claimWait),
          leaseTtl: duration(this.leaseTtl),
          complete: [],
          claimId: id,
          buildId: this.buildId,
          labels: { ...this.labels },
        },
        this.claimWait + this.callTimeout,
      );
      const outcome = await Promise.race([
        claim.then(
          (resp) => ({ resp }),
          (error: unknown) => ({ error }),
        ),
        aborted(this.stopping.signal).then(() => undefined),
      ]);
      if (outcome === undefined) {
        this.inFlightClaim = claim; // stopping: its answer is handed back (see above)
        break;
      }
      if ("error" in outcome) {
        const err = outcome.error;
        if (!(err instanceof AwooopError)) throw err;
        this.claimIds.answered(err);
        if (FATAL_CODES.includes(err.code)) throw new WorkerError(`ClaimRuns: ${err.message}`);
        this.counts.claimErrors += 1;
        this.log("warn", "claim failed; retrying", { error: err.message, backoff_s: backoff });
        await sleep(backoff, this.stopping.signal);
        backoff = Math.min(backoff * 2, 5);
        continue;
      }
      this.claimIds.answered();
      backoff = 0.2;
      const runs = outcome.resp.runs;
      this.accept(runs);
      if (runs.length > 0 || this.claimWait <= 0 || now() - sentAt >= this.claimWait / 2) {
        early = 0;
        continue;
      }
      // empty long before the wait was over: a scheduler ending its long-polls (draining) or one
      // that cannot wait; back off so this is no claim storm
      early += 1;
      this.counts.earlyEmptyClaims += 1;
      const pause = Math.min(0.05 * 2 ** early, 2, this.claimWait) * (0.5 + Math.random() / 2);
      await sleep(pause, this.stopping.signal);
    }
  }

  /**
   * One ClaimRuns that also completes the carried runs. It does not wait for work (a call carrying
   * completions answers once they are applied), so it is awaited to the end, stop or not: the
   * completions' callers get their answers.
   */
  private async claimCarrying(carried: PendingCompletion[], free: number): Promise<void> {
    const { id, maxRuns } = this.claimIds.next(Math.min(free, 100));
    this.counts.claimsSent += 1;
    let resp: ClaimRunsResponse;
    try {
      resp = await this.client.call(this.client.scheduler, "claimRuns", {
        workerId: this.workerId,
        projectIds: [...this.projects],
        maxRuns,
        wait: undefined,
        leaseTtl: duration(this.leaseTtl),
        complete: carried.map((p) => p.request),
        claimId: id,
        buildId: this.buildId,
        labels: { ...this.labels },
      });
    } catch (err) {
      if (!(err instanceof AwooopError)) throw err;
      this.claimIds.answered(err);
      this.counts.claimErrors += 1;
      // bad input: the completions go again with CompleteRuns, and the next claim, without them,
      // tells whether the claim itself was bad (then fatal, as always)
      this.completions.claimFailed(carried, err);
      if (err.code !== Code.INVALID_ARGUMENT) {
        if (FATAL_CODES.includes(err.code)) throw new WorkerError(`ClaimRuns: ${err.message}`);
        this.log("warn", "claim failed; retrying", { error: err.message });
        await sleep(0.2, this.stopping.signal);
      }
      return;
    }
    this.claimIds.answered();
    this.completions.settle(carried, resp.completed);
    this.accept(resp.runs);
  }

  /** Starts a handler for each claimed run; once stopping, hands them back unstarted. */
  private accept(runs: ClaimedRun[]): void {
    for (const claimed of runs) {
      this.counts.claimed += 1;
      const ctx = new RunContext(this.client, claimed, this.workerId, this.stopping.signal, this.completions, this.tracer);
      if (this.stopping.signal.aborted) {
        this.log("info", "claimed while stopping; handing it back unstarted", { run_id: ctx.runId });
        this.returning.push(
          this.handBack(ctx).then((settled) => {
            if (!settled) this.unsettled.push(name(ctx));
          }),
        );
      } else {
        this.start(ctx, claimed);
      }
    }
  }

  private start(ctx: RunContext, claimed: ClaimedRun): void {
    const ttl = this.leaseTtl ?? grantedTtl(claimed) ?? 300;
    const h: Held = { ctx, ttl, renewedUntil: now() + ttl, done: Promise.resolve(), handlerDone: false, settled: false };
    this.held.set(key(ctx), h);
    metrics.HELD.set(this.held.size);
    this.log("info", "claimed run", { run_id: ctx.runId, attempt: ctx.attempt, resumed: ctx.resumed });
    const span = startRunSpan(this.tracer, {
      traceparent: ctx.traceparent,
      claimableSince: claimed.claimableSince,
      attributes: { "awooop.run_id": ctx.runId, "awooop.attempt": ctx.attempt, "awooop.worker_id": this.workerId },
    });
    if (span === undefined) {
      h.done = this.execute(h);
      return;
    }
    ctx.traceContext = trace.setSpan(ROOT_CONTEXT, span);
    h.done = context.with(ctx.traceContext, () => this.execute(h)).finally(() => span.end());
  }

  // --- one run ---

  private async execute(h: Held): Promise<void> {
    try {
      h.settled = await this.handle(h);
    } catch (err) {
      this.log("error", "settling the run failed", { run_id: h.ctx.runId, error: describe(err) });
    } finally {
      h.ctx.tokens.close(); // a parked, lost or released run's batch timer stops with it
      this.held.delete(key(h.ctx));
      metrics.HELD.set(this.held.size);
      this.slotFreed.abort();
      if (!h.settled && this.stopping.signal.aborted) this.unsettled.push(name(h.ctx));
    }
  }

  /** Runs the handler and ends the run by its outcome. True when the run is settled. */
  private async handle(h: Held): Promise<boolean> {
    const ctx = h.ctx;
    const handled = (async () => {
      try {
        return { output: await this.handler(ctx) };
      } catch (error) {
        return { error };
      } finally {
        h.handlerDone = true;
      }
    })();
    // a stopped handler is not waited for: JavaScript cannot cancel it, and it may never return
    const first = await Promise.race([handled, aborted(ctx.signal).then(() => undefined)]);
    if (first === undefined || h.stopReason !== undefined) return this.afterStop(h);
    if ("error" in first) {
      const err = first.error;
      if (err instanceof LeaseLost) {
        this.count("lost");
        this.log("warn", "lease lost; handler stopped", { run_id: ctx.runId, attempt: ctx.attempt });
        return true;
      }
      if (err instanceof RunFinished) {
        this.log("error", "handler kept using a finished run", { run_id: ctx.runId, error: err.message });
        return true;
      }
      if (err instanceof RunParked) {
        // parked on a durable wait: no longer ours until the wait ends
        this.count("parked");
        this.log("info", "run parked on a wait", { run_id: ctx.runId, wait: err.stepId });
        return true;
      }
      if (ctx.finished) {
        this.log("error", `handler threw after the run was ${ctx.outcome}`, { run_id: ctx.runId, error: describe(err) });
        return true;
      }
      if (ctx.nondeterminism !== undefined) return this.hold(h); // thrown, or caught and followed by another error
      const reason = describe(err);
      if (err instanceof WaitTimeout) {
        // a wait's time ran out and the handler did not go on: fail the run (not retryable)
        this.log("warn", "handler left a wait timeout uncaught; failing the run", { run_id: ctx.runId });
        return this.final(h, "failed", () => ctx.fail(reason, { errorCode: WAIT_TIMED_OUT_CODE }));
      }
      this.log("error", "handler threw; failing the attempt (retryable)", { run_id: ctx.runId, error: reason });
      return this.final(h, "failed", () => ctx.fail(reason, { retryable: true, errorCode: "E-WORKER-HANDLER" }));
    }
    if (ctx.finished) {
      this.count(OUTCOMES[ctx.outcome ?? "completed"] ?? "completed");
      return true;
    }
    try {
      ctx.checkReplayed(); // remembered in ctx.nondeterminism
    } catch (err) {
      if (!(err instanceof Nondeterminism)) throw err;
    }
    if (ctx.nondeterminism !== undefined) return this.hold(h);
    const output = asOutput(first.output);
    return this.final(h, "completed", () => ctx.complete(output));
  }

  /**
   * The handler's code does not replay the run's journal: hold the run for an operator (HoldRun)
   * instead of failing it, which would compensate work the right code might finish.
   */
  private hold(h: Held): Promise<boolean> {
    const ctx = h.ctx;
    const found = ctx.nondeterminism?.message ?? "nondeterminism";
    this.log("error", "holding the run for an operator", { run_id: ctx.runId, error: found });
    return this.final(h, "held", () => ctx.hold(found));
  }

  /**
   * Ends the run with end() (sent again after UNAVAILABLE / DEADLINE_EXCEEDED while the lease
   * lasts, or the shutdown allows). One that cannot be ended while stopping is handed back.
   */
  private async final(h: Held, outcome: "completed" | "failed" | "held", end: () => Promise<unknown>): Promise<boolean> {
    const ctx = h.ctx;
    try {
      await settling.until(() => this.endingDeadline(h), () => end());
      this.count(outcome);
      return true;
    } catch (err) {
      if (err instanceof LeaseLost) {
        this.count("lost");
        this.log("warn", `lease lost before the run could be ${outcome}`, { run_id: ctx.runId });
        return true;
      }
      if (!this.stopping.signal.aborted) {
        this.count("errors");
        this.log("error", `could not record the run as ${outcome}`, { run_id: ctx.runId, error: describe(err) });
        return false;
      }
      this.log("warn", `could not record the run as ${outcome}; handing it back`, { run_id: ctx.runId, error: describe(err) });
      return this.handBack(ctx);
    }
  }

  /** Tells the scheduler why the handler was stopped. True when settled. */
  private async afterStop(h: Held): Promise<boolean> {
    const ctx = h.ctx;
    if (h.stopReason === "lease_lost") {
      this.count("lost");
      metrics.LEASES_LOST.inc();
      this.log("warn", "lease lost; handler stopped", { run_id: ctx.runId, attempt: ctx.attempt });
      return true;
    }
    if (h.stopReason === "shutdown") return this.handBack(ctx);
    try {
      await settling.until(
        () => this.settleDeadline(),
        (timeout) =>
          this.client.call(this.client.scheduler, "acknowledgeCancel", { lease: ctx.lease }, Math.min(timeout, this.callTimeout)),
      );
    } catch (err) {
      this.count(err instanceof LeaseLost ? "lost" : "errors");
      this.log("warn", `after stopping the handler (${h.stopReason})`, { run_id: ctx.runId, error: describe(err) });
      return err instanceof LeaseLost;
    }
    this.count("cancelled");
    this.log("info", "cancel requested; handler stopped and cancel acknowledged", { run_id: ctx.runId });
    return true;
  }

  /** ReleaseRun (the attempt is not counted), sent again until the shutdown's settle deadline. True when settled. */
  private async handBack(ctx: RunContext): Promise<boolean> {
    const request = { lease: ctx.lease, reason: `worker ${this.workerId} shutting down` };
    try {
      await settling.until(
        () => this.settleDeadline(),
        (timeout) => this.client.call(this.client.scheduler, "releaseRun", request, Math.min(timeout, this.callTimeout)),
      );
    } catch (err) {
      if (err instanceof LeaseLost) {
        // released by an earlier try whose answer was lost, or reaped meanwhile
        this.count("lost");
        this.log("warn", "hand-back: lease no longer ours", { run_id: ctx.runId, error: err.message });
        return true;
      }
      this.count("errors");
      this.log("error", "could not hand the run back", { run_id: ctx.runId, error: describe(err) });
      return false;
    }
    this.count("released");
    this.log("info", "worker shutting down; lease handed back", { run_id: ctx.runId, attempt: ctx.attempt });
    return true;
  }

  // --- deadlines ---

  private graceEnd(): number {
    return (this.stoppedAt ?? now()) + this.shutdownGrace;
  }

  /** Hand-backs are tried until then: two call timeouts after the grace. */
  private settleDeadline(): number {
    return this.graceEnd() + 2 * this.callTimeout;
  }

  /** Ending calls: while the lease surely lasts; when stopping, until one call timeout after the grace. */
  private endingDeadline(h: Held): number {
    return this.stopping.signal.aborted ? this.graceEnd() + this.callTimeout : h.renewedUntil;
  }

  private count(outcome: Outcome): void {
    this.counts[outcome] += 1;
    metrics.RUNS.inc({ outcome: OUTCOME_LABELS[outcome] });
  }

  private stopHandler(h: Held, reason: StopReason): void {
    if (h.stopReason !== undefined || h.ctx.finished || h.handlerDone) return; // stopping, or being ended now
    h.stopReason = reason;
    h.ctx.stop(reason);
  }

  // --- leases ---

  private async heartbeatLoop(done: AbortSignal): Promise<void> {
    for (;;) {
      await sleep(this.heartbeatInterval, done);
      if (done.aborted) return;
      try {
        await this.heartbeatOnce();
      } catch (err) {
        // a bug here must not silently end lease renewal for every run
        this.log("error", "heartbeat round failed", { error: describe(err) });
      }
    }
  }

  /** Renews every held lease with one Heartbeat call (per 1000 leases); stops the handlers whose lease is lost or whose run was asked to cancel. */
  async heartbeatOnce(): Promise<void> {
    const live = [...this.held.values()].filter((h) => h.stopReason === undefined && !h.ctx.finished);
    for (let i = 0; i < live.length; i += HEARTBEAT_BATCH) {
      const batch = live.slice(i, i + HEARTBEAT_BATCH);
      const sentAt = now();
      this.counts.heartbeatsSent += 1;
      let resp;
      try {
        resp = await this.client.call(this.client.scheduler, "heartbeat", {
          workerId: this.workerId,
          leases: batch.map((h) => h.ctx.lease),
          leaseTtl: duration(this.leaseTtl),
        });
      } catch (err) {
        metrics.HEARTBEATS.inc({ result: "error" });
        this.log("warn", "heartbeat failed", { error: describe(err), leases: batch.length });
        for (const h of batch) {
          if (now() >= h.renewedUntil) {
            this.log("warn", "lease expired without a successful heartbeat; stopping the handler", { run_id: h.ctx.runId });
            this.stopHandler(h, "lease_lost");
          }
        }
        continue;
      }
      metrics.HEARTBEATS.inc({ result: "ok" });
      const byKey = new Map(batch.map((h) => [key(h.ctx), h]));
      for (const renewal of resp.renewals) {
        const h = renewal.lease && byKey.get(`${renewal.lease.runId}/${renewal.lease.attempt}`);
        if (!h) continue;
        if (renewal.outcome === LeaseOutcome.LEASE_OUTCOME_LEASE_LOST) {
          this.stopHandler(h, "lease_lost");
        } else if (renewal.cancelRequested) {
          this.stopHandler(h, "cancel_requested");
        } else if (renewal.outcome === LeaseOutcome.LEASE_OUTCOME_RENEWED) {
          h.renewedUntil = sentAt + h.ttl;
          this.counts.leasesRenewed += 1;
        }
      }
    }
  }

  // --- shutdown ---

  /** Gives handlers the rest of the grace, stops the others, and waits until every run held is settled (or its settling gave up). */
  private async shutdown(): Promise<void> {
    const claim = this.returnInFlightClaim();
    const running = [...this.held.values()].map((h) => h.done);
    if (running.length > 0) {
      this.log("info", "waiting for running handlers", { handlers: running.length, grace_s: this.shutdownGrace });
      await within(Promise.all(running), this.graceEnd() - now());
    }
    for (const h of this.held.values()) this.stopHandler(h, "shutdown");
    const rest = [...this.held.values()].map((h) => h.done);
    if (rest.length > 0) {
      // each settles by its deadline; the extra call timeout bounds a settling call that hangs
      await within(Promise.all(rest), this.settleDeadline() + this.callTimeout - now());
    }
    await claim;
    await Promise.all(this.returning);
  }

  /** Awaits the ClaimRuns in flight at the stop and hands back the runs it claimed. */
  private async returnInFlightClaim(): Promise<void> {
    if (this.inFlightClaim === undefined) return;
    let resp: ClaimRunsResponse;
    try {
      resp = await this.inFlightClaim;
    } catch {
      return; // no answer: a call that ended unanswered has its runs handed back by the scheduler
    }
    this.accept(resp.runs);
  }

  /** Logs the runs held at the stop that are neither ended nor handed back; the error for run() ("" when none). */
  private logUnsettled(): string {
    const left = [...new Set([...this.unsettled, ...this.leases])].sort();
    if (left.length === 0) return "";
    const names = left.join(", ");
    const message = `could not settle ${left.length} runs before stopping: ${names}`;
    this.log("error", `${message}; they stay RUNNING until their lease expires`, { worker_id: this.workerId });
    return message;
  }
}

function key(ctx: RunContext): string {
  return `${ctx.runId}/${ctx.attempt}`;
}

function name(ctx: RunContext): string {
  return `${ctx.runId} (attempt ${ctx.attempt})`;
}

/** Lease length the scheduler granted, from two database timestamps (no clock skew). */
function grantedTtl(claimed: ClaimedRun): number | undefined {
  const until = claimed.leaseUntil?.getTime();
  const from = claimed.run?.heartbeatAt?.getTime();
  if (until === undefined || from === undefined) return undefined;
  const ttl = (until - from) / 1000;
  return ttl > 0 ? ttl : undefined;
}

function asOutput(value: unknown): Json {
  if (value === null || value === undefined) return {};
  if (typeof value === "object" && !Array.isArray(value)) return value as Json;
  return { result: value };
}


