// Replay checks: a resumed handler must meet the journal its run's earlier attempts left (the rule
// of the Python SDK's awooop/worker/replay.py, docs/worker-sdk.md "Replay and deploys").
//
// Each journaling call of a resumed attempt (a step, an approval, a durable wait) is checked
// against the journal the attempt found: a step id it holds must be called as the same kind of
// step with the same tool, and, when it holds it completed, with the same parameters; its completed
// steps up to the first step an earlier attempt did not complete must be reached in journal order,
// before any later or new step and before the run completes. A mismatch throws Nondeterminism and
// the worker holds the run (HoldRun) for an operator.
//
// Patches (ctx.patched) are journaled as markers (PATCH_PREFIX): answers, not steps, so the check
// leaves them out. A patch asked for the first time while the journal holds steps this attempt has
// not reached was passed by an earlier attempt under code without it: its answer is false.
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
  private readonly prefix: SagaStep[] = [];
  private readonly reached = new Set<string>();

  constructor(
    readonly runId: string,
    steps: readonly SagaStep[],
  ) {
    const ordered = steps.filter((s) => !s.stepId.startsWith(PATCH_PREFIX)).sort((a, b) => a.seq - b.seq);
    for (const s of ordered) this.steps.set(s.stepId, s);
    for (const s of ordered) {
      if (s.status !== StepStatus.STEP_STATUS_COMPLETED) break;
      this.prefix.push(s);
    }
  }

  /** The handler journals stepId (params undefined: a step without its own, an approval or a wait). */
  reach(stepId: string, kind: number, toolId = "", params?: Record<string, unknown>): void {
    const known = this.steps.get(stepId);
    if (known !== undefined) {
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
    if (this.reached.has(stepId)) return;
    const first = this.prefix.find((s) => !this.reached.has(s.stepId) && (known === undefined || s.seq < known.seq));
    if (first !== undefined) {
      const where = known === undefined ? "a step the journal does not hold" : `journaled as step ${known.seq}`;
      throw new Nondeterminism(
        this.runId,
        stepId,
        `called (${where}) before step ${first.seq}, '${first.stepId}', which an earlier attempt completed before it and this code has not reached`,
      );
    }
    this.reached.add(stepId);
  }

  /** Every journaled step was reached: no earlier attempt went further than this point. */
  atFrontier(): boolean {
    return [...this.steps.keys()].every((id) => this.reached.has(id));
  }

  /** The handler completes the run: every step of the replayed prefix must have been reached. */
  finish(): void {
    const missing = this.prefix.filter((s) => !this.reached.has(s.stepId));
    if (missing.length > 0) {
      const first = missing[0];
      throw new Nondeterminism(
        this.runId,
        first.stepId,
        `step ${first.seq}, which an earlier attempt completed, was never reached: the code completes the run without it (${missing.length} journaled step(s) not reached)`,
      );
    }
  }
}
