// Replay checks: a resumed handler must meet the journal its run's earlier attempts left (the rule
// of the Python SDK's awooop/worker/replay.py, docs/worker-sdk.md "Replay and deploys").
//
// Each journaling call of a resumed attempt is checked against the journal the attempt found: a
// step id it holds must be called as the same kind of step with the same tool, and, when it holds
// it completed, with the same parameters; the steps the handler calls itself must come in journal
// order; new work must not come before journaled work (an insertion), and a new tool call made
// exactly as a completed one the replay has not reached is that step renamed. A journaled step the
// code does not call again is no change by itself. The SDK's own entries (a wait's creation and
// outcome, a fan-in of children) are checked by kind only. A mismatch throws Nondeterminism and the
// worker holds the run (HoldRun) for an operator.
//
// Patches (ctx.patched) are journaled as markers (PATCH_PREFIX): answers, not steps, so the check
// leaves them out. A patch asked for the first time while the journal holds entries this attempt
// has not reached was passed by an earlier attempt under code without it: its answer is false.
import { type SagaStep, StepStatus, StepType } from "./gen/awooop/common/v1/common";

/** The run's error_code while it is held for a mismatch (HoldRun). */
export const NONDETERMINISM_CODE = "E-WORKER-NONDETERMINISM";
/** The step ids of ctx.patched's markers. */
export const PATCH_PREFIX = "patch:";

const KINDS: Partial<Record<number, string>> = {
  [StepType.STEP_TYPE_LLM_CALL]: "llm_call",
  [StepType.STEP_TYPE_TOOL_CALL]: "tool_call",
  [StepType.STEP_TYPE_APPROVAL_REQUEST]: "approval_request",
  [StepType.STEP_TYPE_CALLBACK]: "callback",
};

/** The handler's code does not replay the run's journal; every later ctx call throws it again. */
export class Nondeterminism extends Error {
  constructor(
    readonly runId: string,
    readonly stepId: string,
    what: string,
  ) {
    super(`run ${runId} does not replay its journal at step '${stepId}': ${what}`);
    this.name = "Nondeterminism";
  }
}

const call = (kind: number, toolId: string): string => {
  const name = KINDS[kind] ?? String(kind);
  return toolId ? `${name} ${toolId}` : name;
};

/** JSON with sorted keys: parameters compared as the journal keeps them (a Struct). */
const canonical = (value: unknown): string =>
  JSON.stringify(value, (_key, v: unknown) =>
    v !== null && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(Object.entries(v as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))
      : v,
  );

/** One resumed attempt's check against the journal it found. */
export class ReplayCheck {
  private readonly steps = new Map<string, SagaStep>();
  private readonly reached = new Set<string>();
  private last: SagaStep | undefined; // the latest journaled step the handler reached
  private newStep: string | undefined; // a step the journal does not hold, called since then

  constructor(
    readonly runId: string,
    steps: readonly SagaStep[],
  ) {
    const ordered = steps.filter((s) => !s.stepId.startsWith(PATCH_PREFIX)).sort((a, b) => a.seq - b.seq);
    for (const s of ordered) this.steps.set(s.stepId, s);
  }

  /**
   * The handler journals stepId (params undefined: a step without its own, an approval or a wait).
   * ordered false: the SDK's own entry of a wait or a fan-in, checked by kind only.
   */
  reach(stepId: string, kind: number, toolId = "", params?: Record<string, unknown>, ordered = true): void {
    const known = this.steps.get(stepId);
    if (known !== undefined) this.sameCall(known, stepId, kind, toolId, params);
    if (ordered && !this.reached.has(stepId)) {
      if (known === undefined) {
        this.renamed(stepId, kind, toolId, params);
        this.newStep ??= stepId;
      } else {
        this.inOrder(known);
        this.last = known;
        this.newStep = undefined;
      }
    }
    this.reached.add(stepId);
  }

  private sameCall(known: SagaStep, stepId: string, kind: number, toolId: string, params?: Record<string, unknown>): void {
    if (known.stepType !== kind || known.toolId !== toolId) {
      throw new Nondeterminism(
        this.runId,
        stepId,
        `journaled (step ${known.seq}) as ${call(known.stepType, known.toolId)}, called now as ${call(kind, toolId)}`,
      );
    }
    const completed = known.status === StepStatus.STEP_STATUS_COMPLETED;
    if (completed && params !== undefined && canonical(params) !== canonical(known.toolParams ?? {})) {
      throw new Nondeterminism(
        this.runId,
        stepId,
        `journaled (step ${known.seq}, completed) with other parameters than it is called with now`,
      );
    }
  }

  private inOrder(known: SagaStep): void {
    const last = this.last;
    if (last !== undefined && known.seq < last.seq) {
      throw new Nondeterminism(
        this.runId,
        known.stepId,
        `journaled as step ${known.seq}, before step ${last.seq} ('${last.stepId}'), but called after it`,
      );
    }
    if (this.newStep !== undefined && known.status === StepStatus.STEP_STATUS_COMPLETED) {
      throw new Nondeterminism(
        this.runId,
        this.newStep,
        `a step the journal does not hold, called before step ${known.seq} ('${known.stepId}'), which an earlier attempt completed without it`,
      );
    }
  }

  /** Only tool calls: the steps whose repeat is a side effect done twice. */
  private renamed(stepId: string, kind: number, toolId: string, params?: Record<string, unknown>): void {
    if (kind !== StepType.STEP_TYPE_TOOL_CALL) return;
    const made = canonical(params ?? {});
    for (const s of this.steps.values()) {
      if (
        !this.reached.has(s.stepId) &&
        s.status === StepStatus.STEP_STATUS_COMPLETED &&
        s.stepType === kind &&
        s.toolId === toolId &&
        canonical(s.toolParams ?? {}) === made &&
        (this.last === undefined || s.seq > this.last.seq)
      ) {
        throw new Nondeterminism(
          this.runId,
          stepId,
          `not in the journal, but called as step ${s.seq} ('${s.stepId}') was, which an earlier attempt completed and this code has not reached: a renamed step would do its work twice`,
        );
      }
    }
  }

  /** Every journaled entry was reached: no earlier attempt went further than this point. */
  atFrontier(): boolean {
    return [...this.steps.keys()].every((id) => this.reached.has(id));
  }
}
