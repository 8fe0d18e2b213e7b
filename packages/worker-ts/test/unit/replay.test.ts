// The replay rule of the TypeScript SDK (src/replay.ts), case by case, the same cases as the Python
// SDK's (tests/test_replay_check.py): the two SDKs hold a run for the same changes of code.
import assert from "node:assert/strict";
import { test } from "node:test";
import { common, Nondeterminism, ReplayCheck, workerBuild } from "../../src/index";

const { StepStatus, StepType } = common;
const [CALLBACK, TOOL, LLM, APPROVAL] = [
  StepType.STEP_TYPE_CALLBACK,
  StepType.STEP_TYPE_TOOL_CALL,
  StepType.STEP_TYPE_LLM_CALL,
  StepType.STEP_TYPE_APPROVAL_REQUEST,
];
const [DONE, PENDING, FAILED] = [
  StepStatus.STEP_STATUS_COMPLETED,
  StepStatus.STEP_STATUS_PENDING,
  StepStatus.STEP_STATUS_FAILED,
];

function step(seq: number, stepId: string, stepType = CALLBACK, status = DONE, toolId = "", params?: object) {
  return common.SagaStep.fromPartial({ seq, stepId, stepType, status, toolId, toolParams: params as never });
}

const check = (...steps: ReturnType<typeof step>[]) => new ReplayCheck("r1", steps);

function throwsSaying(fn: () => void, says: string): void {
  assert.throws(fn, (err: unknown) => err instanceof Nondeterminism && err.message.includes(says));
}

test("the same code replays in order and may go on with new steps", () => {
  const c = check(step(1, "a", TOOL, DONE, "scale", { replicas: 3 }), step(2, "b", LLM), step(3, "approval", APPROVAL, PENDING));
  c.reach("a", TOOL, "scale", { replicas: 3 });
  c.reach("b", LLM, "", {});
  c.reach("approval", APPROVAL);
  assert.equal(c.atFrontier(), true);
  c.reach("c", CALLBACK, "", { x: 1 });
  c.finish();
});

test("a changed kind, tool, parameter, order or an inserted step is nondeterminism", () => {
  const cases: [string, number, string, object, string][] = [
    ["a", LLM, "", {}, "as tool_call scale, called now as llm_call"],
    ["a", TOOL, "resize", { replicas: 3 }, "as tool_call scale, called now as tool_call resize"],
    ["a", TOOL, "scale", { replicas: 4 }, "other parameters"],
    ["b", CALLBACK, "", {}, "before step 1, 'a'"],
    ["new", CALLBACK, "", {}, "a step the journal does not hold"],
  ];
  for (const [id, kind, tool, params, says] of cases) {
    const c = check(step(1, "a", TOOL, DONE, "scale", { replicas: 3 }), step(2, "b"));
    throwsSaying(() => c.reach(id, kind, tool, params as Record<string, unknown>), says);
  }
});

test("a removed step is found at the next journaled call or at completion", () => {
  const c = check(step(1, "a"), step(2, "b"), step(3, "c"));
  c.reach("a", CALLBACK, "", {});
  throwsSaying(() => c.reach("c", CALLBACK, "", {}), "before step 2, 'b'");
  const tail = check(step(1, "a"), step(2, "b"));
  tail.reach("a", CALLBACK, "", {});
  assert.equal(tail.atFrontier(), false);
  throwsSaying(() => tail.finish(), "never reached");
});

test("after a step an earlier attempt did not complete, the code may take another path", () => {
  const c = check(step(1, "prep"), step(2, "a", TOOL, FAILED, "scale", { replicas: 1 }), step(3, "fallback"));
  c.reach("prep", CALLBACK, "", {});
  c.reach("a", TOOL, "scale", { replicas: 2 });
  c.reach("report", CALLBACK, "", {});
  c.finish();
  throwsSaying(() => c.reach("fallback", LLM, "", {}), "called now as llm_call");
});

test("patch markers are answers, not steps; the build comes from AWOOOP_WORKER_BUILD", () => {
  const c = check(step(1, "a"), step(2, "patch:x", CALLBACK, DONE), step(3, "b"));
  c.reach("a", CALLBACK, "", {});
  c.reach("b", CALLBACK, "", {});
  c.finish();
  assert.equal(workerBuild({ AWOOOP_WORKER_BUILD: " v7 " }), "v7");
  assert.equal(workerBuild({}), "");
});
