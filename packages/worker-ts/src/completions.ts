// Completions share CompleteRuns calls: while one call is in flight, the runs that finish
// meanwhile wait and go together in the next (no timers). Each caller still gets its own run's
// answer or error (LeaseLost for a stale token), as CompleteRun would give it. A batch refused as
// INVALID_ARGUMENT (one bad item, e.g. an oversized output) is sent again item by item with
// CompleteRun, so only the bad item's caller gets the error; a failure of the whole call
// (scheduler unreachable) goes to every caller in it.
import { status as Code } from "@grpc/grpc-js";
import { AwooopError, LEASE_LOST, LeaseLost } from "./errors";
import type { Client } from "./client";
import type { Run } from "./gen/awooop/common/v1/common";
import type { CompleteRunRequest } from "./gen/awooop/scheduler/v1/scheduler";

const BATCH = 1000; // the scheduler's limit per CompleteRuns call

// the status CompleteRun answers each refusal reason with
const CODES: Readonly<Record<string, Code>> = {
  LEASE_LOST: Code.FAILED_PRECONDITION,
  INVALID_TRANSITION: Code.FAILED_PRECONDITION,
  NOT_FOUND: Code.NOT_FOUND,
  FORBIDDEN: Code.PERMISSION_DENIED,
};

interface Pending {
  request: CompleteRunRequest;
  resolve: (run: Run) => void;
  reject: (err: unknown) => void;
}

export class CompletionBatcher {
  /** CompleteRuns calls sent. */
  calls = 0;
  private queue: Pending[] = [];
  private inFlight = false;

  constructor(private readonly client: Client) {}

  /** Completes one run (in the next CompleteRuns call); resolves with the completed run. */
  complete(request: CompleteRunRequest): Promise<Run> {
    return new Promise((resolve, reject) => {
      this.queue.push({ request, resolve, reject });
      void this.flush();
    });
  }

  private async flush(): Promise<void> {
    if (this.inFlight || this.queue.length === 0) return;
    this.inFlight = true;
    const batch = this.queue.splice(0, BATCH);
    try {
      this.calls += 1;
      const resp = await this.client.call(this.client.scheduler, "completeRuns", {
        runs: batch.map((p) => p.request),
      });
      batch.forEach((p, i) => {
        const result = resp.results[i];
        if (result?.run !== undefined && result.errorReason === "") {
          p.resolve(result.run);
          return;
        }
        const reason = result?.errorReason || "UNKNOWN";
        const Kind = reason === LEASE_LOST ? LeaseLost : AwooopError;
        const message = result?.errorMessage || "no result for this run";
        p.reject(new Kind(CODES[reason] ?? Code.UNKNOWN, reason, message, { run_id: p.request.lease?.runId ?? "" }, [], "CompleteRuns"));
      });
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

  private async completeOne(p: Pending): Promise<void> {
    try {
      const resp = await this.client.call(this.client.scheduler, "completeRun", p.request);
      if (resp.run === undefined) throw new Error("CompleteRun answered no run");
      p.resolve(resp.run);
    } catch (err) {
      p.reject(err);
    }
  }
}
