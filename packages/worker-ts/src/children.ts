// Child runs (docs/worker-sdk.md, "Child runs"): what ctx.startChild and ctx.runChildren take and
// answer, and how a StartChildRuns answer becomes the handler's outcomes.
//
// A child is a run of the parent's project, started by StartChildRuns under the parent's lease and
// identified by (parent run, step id): a parent run again from the top (after a crash, or after it
// parked) asks for the same step ids and gets the same children back, never new ones. The child run
// itself is the durable record of the start; its outcome is read from the child when the parent
// resumes (not journaled in the parent).
import { WaitTimeout } from "./errors";
import { runStatusToJSON, type RunStatus } from "./gen/awooop/common/v1/common";
import type { ChildRun, ChildRunSpec } from "./gen/awooop/scheduler/v1/scheduler";

type Json = { [key: string]: unknown };

/** The statuses an ended child's outcome names. */
export const ENDED: readonly string[] = ["completed", "failed", "cancelled"];

/**
 * A child run to start: its input and the usual run options. stepId names it within the parent
 * (unique per parent); given, or numbered in call order (`child-1`, ...), so a handler must start
 * its children in the same order on every attempt, as it runs its steps.
 */
export interface Child {
  input?: Json;
  stepId?: string;
  /** Claim order within the project: higher first (-1000..1000). */
  priority?: number;
  /** Seconds before it may be claimed. */
  delay?: number;
  /** Concurrency and rate keys, as CreateRun's. */
  concurrencyKeys?: string[];
  /** 0 (the default): the project's retry policy. */
  maxAttempts?: number;
  /** Worker labels it requires, and prefers (docs/flow-control.md); none of its parent's by default. */
  requiredLabels?: Record<string, string>;
  preferredLabels?: Record<string, string>;
}

/**
 * A child as the parent sees it: status is completed, failed or cancelled once it ended (or its
 * current status, lowercased, for a sibling a fail-fast is still cancelling).
 */
export interface ChildOutcome {
  stepId: string;
  runId: string;
  status: string;
  output: Json;
  error: string;
  errorCode: string;
  ok: boolean;
  ended: boolean;
}

/** The children did not all end within runChildren's (or a handle's result's) timeout. */
export class ChildrenTimeout extends WaitTimeout {
  constructor(stepId: string, waitId: string) {
    super(stepId, waitId);
    this.name = "ChildrenTimeout";
  }
}

export function childSpec(child: Child, stepId: string): ChildRunSpec {
  return {
    stepId,
    input: child.input ?? {},
    priority: child.priority ?? 0,
    notBefore: child.delay ? new Date(Date.now() + child.delay * 1000) : undefined,
    concurrencyKeys: child.concurrencyKeys ?? [],
    maxAttempts: child.maxAttempts ?? 0,
    requiredLabels: { ...(child.requiredLabels ?? {}) },
    preferredLabels: { ...(child.preferredLabels ?? {}) },
  };
}

/** `completed` for RUN_STATUS_COMPLETED, and so on. */
export function statusName(status: RunStatus): string {
  return runStatusToJSON(status).replace(/^RUN_STATUS_/, "").toLowerCase();
}

/** A child of StartChildRuns' answer as the handler sees it; `output` is read by the caller when omitted. */
export function outcomeOf(c: ChildRun, output: Json): ChildOutcome {
  const status = statusName(c.status);
  return {
    stepId: c.stepId,
    runId: c.runId,
    status,
    output,
    error: c.failureReason,
    errorCode: c.errorCode,
    ok: status === "completed",
    ended: ENDED.includes(status),
  };
}
