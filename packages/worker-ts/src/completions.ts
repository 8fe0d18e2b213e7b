// Completes runs in batches with CompleteRuns, or on the worker's next ClaimRuns.
//
// One CompleteRuns call is in flight at a time; completions that become ready meanwhile queue and
// go together in the next call (no timers). A full worker (every slot busy, its claim loop waiting
// for a slot) has a ClaimRuns to send as soon as a run finishes: completions ready then are held
// for that call instead (ClaimRunsRequest.complete; the worker takes them with take() and hands the
// answers back with settle()), so a busy worker's cycle is ClaimRuns + Heartbeat. A scheduler that
// answers no results for them (older than the field) gets them with CompleteRuns, and none is held
// again.
//
// Each caller still gets its own run's answer or error (LeaseLost for a stale token), as
// CompleteRun would give it. A batch refused as INVALID_ARGUMENT (one bad item, e.g. an oversized
// output) is sent again item by item with CompleteRun, so only the bad item's caller gets the
// error; a failure of the whole call (scheduler unreachable) goes to every caller in it.
import { status as Code } from "@grpc/grpc-js";
import { AwooopError, LEASE_LOST, LeaseLost } from "./errors";
import type { Client } from "./client";
import type { Run } from "./gen/awooop/common/v1/common";
import type { CompleteRunRequest, CompleteRunResult } from "./gen/awooop/scheduler/v1/scheduler";
import { untraced } from "./tracing";

const BATCH = 1000; // the scheduler's limit per CompleteRuns call (and per ClaimRunsRequest.complete)

// the status CompleteRun answers each refusal reason with
const CODES: Readonly<Record<string, Code>> = {
  LEASE_LOST: Code.FAILED_PRECONDITION,
  INVALID_TRANSITION: Code.FAILED_PRECONDITION,
  NOT_FOUND: Code.NOT_FOUND,
  FORBIDDEN: Code.PERMISSION_DENIED,
};

export interface PendingCompletion {
  request: CompleteRunRequest;
  resolve: (run: Run) => void;
  reject: (err: unknown) => void;
}

export class CompletionBatcher {
  /** CompleteRuns calls sent. */
  calls = 0;
  /** Completions answered by ClaimRuns calls. */
  carried = 0;
  private queue: PendingCompletion[] = [];
  private inFlight = false;
  private held: PendingCompletion[] = []; // waiting for the worker's next ClaimRuns
  private carry = true; // false once a scheduler ignored completions carried by ClaimRuns
  private wants: () => boolean = () => false;
  private onHeld: () => void = () => undefined;

  constructor(private readonly client: Client) {}

  /**
   * wants(): true while a ClaimRuns will go out as soon as a run finishes (the worker is full); a
   * completion made then is held for it and onHeld() is called (to wake the claim loop), which must
   * then take() the held completions and settle() them.
   */
  setCarrier(wants: () => boolean, onHeld: () => void): void {
    this.wants = wants;
    this.onHeld = onHeld;
  }

  /** Completes one run; resolves with it COMPLETED or rejects with CompleteRun's error for it. */
  complete(request: CompleteRunRequest): Promise<Run> {
    return new Promise((resolve, reject) => {
      const pending = { request, resolve, reject };
      if (this.carry && this.wants()) {
        this.held.push(pending);
        this.onHeld();
      } else {
        this.enqueue([pending]);
      }
    });
  }

  /** Completions waiting for the next ClaimRuns. */
  get heldCount(): number {
    return this.held.length;
  }

  /** The held completions (at most 1000), for ClaimRunsRequest.complete. */
  take(): PendingCompletion[] {
    return this.held.splice(0, BATCH);
  }

  /** Answers a batch carried by ClaimRuns from ClaimRunsResponse.completed (none: the scheduler ignored them). */
  settle(batch: PendingCompletion[], results: CompleteRunResult[]): void {
    if (results.length !== batch.length) {
      this.carry = false;
      this.enqueue(batch);
      return;
    }
    this.carried += batch.length;
    answer(batch, results);
  }

  /**
   * The ClaimRuns carrying batch failed as a whole. Bad input: sent again with CompleteRuns, which
   * answers each caller on its own. Otherwise each caller gets the error.
   */
  claimFailed(batch: PendingCompletion[], err: AwooopError): void {
    if (err.code === Code.INVALID_ARGUMENT) {
      this.enqueue(batch);
      return;
    }
    for (const p of batch) p.reject(err);
  }

  /** Sends whatever is held with CompleteRuns (the claim loop is not going to send it). */
  releaseHeld(): void {
    if (this.held.length > 0) this.enqueue(this.held.splice(0));
  }

  private enqueue(batch: PendingCompletion[]): void {
    this.queue.push(...batch);
    void this.flush();
  }

  private async flush(): Promise<void> {
    if (this.inFlight || this.queue.length === 0) return;
    this.inFlight = true;
    const batch = this.queue.splice(0, BATCH);
    try {
      this.calls += 1;
      const resp = await untraced(() =>
        this.client.call(this.client.scheduler, "completeRuns", { runs: batch.map((p) => p.request) }),
      );
      answer(batch, resp.results);
    } catch (err) {
      if (err instanceof AwooopError && err.code === Code.INVALID_ARGUMENT && batch.length > 1) {
        await Promise.all(batch.map((p) => this.completeOne(p)));
      } else {
        for (const p of batch) p.reject(err);
      }
    } finally {
      this.inFlight = false;
      void this.flush();
    }
  }

  private async completeOne(p: PendingCompletion): Promise<void> {
    try {
      const resp = await untraced(() => this.client.call(this.client.scheduler, "completeRun", p.request));
      if (resp.run === undefined) throw new Error("CompleteRun answered no run");
      p.resolve(resp.run);
    } catch (err) {
      p.reject(err);
    }
  }
}

/** Each caller's answer from the per-item results, as CompleteRun would have given it. */
function answer(batch: PendingCompletion[], results: CompleteRunResult[]): void {
  batch.forEach((p, i) => {
    const result = results[i];
    if (result?.run !== undefined && result.errorReason === "") {
      p.resolve(result.run);
      return;
    }
    const reason = result?.errorReason || "UNKNOWN";
    const Kind = reason === LEASE_LOST ? LeaseLost : AwooopError;
    const message = result?.errorMessage || "no result for this run";
    const metadata = { run_id: p.request.lease?.runId ?? "" };
    p.reject(new Kind(CODES[reason] ?? Code.UNKNOWN, reason, message, metadata, [], "CompleteRuns"));
  });
}
