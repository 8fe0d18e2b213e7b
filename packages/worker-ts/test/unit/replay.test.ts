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
  c.reach("c", TOOL, "scale", { replicas: 5 });
});

test("a changed kind, tool or parameter, or a renamed tool call is nondeterminism", () => {
  const cases: [string, number, string, object, string][] = [
    ["a", LLM, "", {}, "as tool_call scale, called now as llm_call"],
    ["a", TOOL, "resize", { replicas: 3 }, "as tool_call scale, called now as tool_call resize"],
    ["a", TOOL, "scale", { replicas: 4 }, "other parameters"],
    ["a2", TOOL, "scale", { replicas: 3 }, "a renamed step would do its work twice"],
  ];
  for (const [id, kind, tool, params, says] of cases) {
    const c = check(step(1, "a", TOOL, DONE, "scale", { replicas: 3 }), step(2, "b"));
    throwsSaying(() => c.reach(id, kind, tool, params as Record<string, unknown>), says);
  }
});

test("a reorder and an insertion are found where they happen", () => {
  const c = check(step(1, "fetch", LLM), step(2, "plan"), step(3, "apply"));
  c.reach("plan", CALLBACK, "", {});
  throwsSaying(() => c.reach("fetch", LLM, "", {}), "journaled as step 1, before step 2 ('plan'), but called after it");
  const d = check(step(1, "fetch", LLM), step(2, "plan"));
  d.reach("fetch", LLM, "", {});
  d.reach("check", CALLBACK, "", {});
  throwsSaying(() => d.reach("plan", CALLBACK, "", {}), "called before step 2 ('plan')");
});

test("a step the code skips on a replay is no change; the SDK's own entries are checked by kind only", () => {
  const c = check(step(1, "a", TOOL, DONE, "scale"), step(2, "wait-1"), step(3, "hand-out"), step(4, "b", TOOL, DONE, "notify"));
  c.reach("a", TOOL, "scale", {});
  c.reach("wait-1", CALLBACK, "", undefined, false);
  c.reach("wait-1:outcome", CALLBACK, "", undefined, false);
  c.reach("b", TOOL, "notify", {});
  assert.equal(c.atFrontier(), false);
  const d = check(step(1, "a"), step(2, "deploy", TOOL, DONE, "run"), step(3, "deploy:wait"), step(4, "b"));
  d.reach("a", CALLBACK, "", {});
  d.reach("deploy", TOOL, "run", {});
  d.reach("b", CALLBACK, "", {});
  throwsSaying(() => d.reach("deploy:wait", TOOL, "x", {}, false), "called now as tool_call");
});

test("after a step an earlier attempt did not complete, the code may take another path", () => {
  const c = check(step(1, "prep"), step(2, "a", TOOL, FAILED, "scale", { replicas: 1 }), step(3, "fallback"));
  c.reach("prep", CALLBACK, "", {});
  c.reach("a", TOOL, "scale", { replicas: 2 });
  c.reach("report", CALLBACK, "", {});
  throwsSaying(() => c.reach("fallback", LLM, "", {}), "called now as llm_call");
});

test("patch markers are answers, not steps; the build comes from AWOOOP_WORKER_BUILD", () => {
  const c = check(step(1, "a"), step(2, "patch:x", CALLBACK, DONE), step(3, "b"));
  c.reach("a", CALLBACK, "", {});
  c.reach("b", CALLBACK, "", {});
  assert.equal(c.atFrontier(), true);
  assert.equal(workerBuild({ AWOOOP_WORKER_BUILD: " v7 " }), "v7");
  assert.equal(workerBuild({}), "");
});
