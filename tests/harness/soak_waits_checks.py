"""The waits soak's checks of the store at its end (tests/test_waits_soak.py), beside the invariant
soak's samples and checks it reuses (tests/harness/soak_invariants.py). Each broken rule is a
`Violations` entry, so one run reports every rule it broke:

- every run ended exactly once (one audit row into a terminal status), as its plan says (a durable
  wait's run by the outcome posted through the path its plan names, the URL or the RPC; a timed-out
  one E-WAIT-TIMEOUT; a parent by its children's ends; a parent an operator cancelled CANCELLED,
  its children with it), or failed by the reaper's attempts;
- no tool side effect ran twice (the gateway's log: one execution per idempotency key), each wait
  ended once, each parent started each of its children once;
- every failed or cancelled run with completed tool steps compensated, and every completed child
  of such a parent (no completed step of a cancelled tree left undone), each run's steps newest
  first, and a failed or cancelled parent's completed children, newest first, before its own
  steps; completed runs keep their side effects;
- every acknowledged event is exactly one run, and no run nobody asked for;
- no background loop recorded a failure: no LOOP_ERROR on a run's history, no schedule error.
"""

from __future__ import annotations

import collections
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from tests.harness import soak_waits_plan as wp
from tests.harness.soak_invariants import TERMINAL, Violations
from tests.harness.soak_waits_plan import RunPlan

URL_ACTOR = "callback:wait-url"  # who a completion through the callback URL is audited as
SWEEP_ACTOR = "system:wait-sweep"

RUNS_SQL = """
SELECT r.run_id::text, r.project_id, r.provider_event_id, r.status, r.error_code, r.saga_status, r.output,
       r.parent_run_id::text, r.parent_step_id, r.child_seq, r.input -> 'soak' AS plan,
       (SELECT count(*) FROM awooop_audit_log a
         WHERE a.run_id = r.run_id AND a.to_status IN ('COMPLETED', 'FAILED', 'CANCELLED')) AS ends
  FROM awooop_run_state r
"""

WAITS_SQL = """
SELECT w.run_id::text, w.step_id, w.kind, w.status, w.completed_by,
       (SELECT count(*) FROM awooop_audit_log a
         WHERE a.run_id = w.run_id AND a.details ->> 'wait_id' = w.wait_id::text
           AND a.action IN ('WAIT_COMPLETED', 'WAIT_TIMED_OUT', 'WAIT_ENDED')) AS endings
  FROM awooop_wait w
"""

STEPS_SQL = """
SELECT run_id::text, step_id, seq, status, compensation_cmd IS NOT NULL AS compensatable
  FROM awooop_saga_step ORDER BY run_id, seq
"""

# the gateway's log: executions per idempotency key, and when each compensation ran (its first
# execution's request id orders them)
TOOL_RUNS_SQL = """
SELECT idempotency_key, count(*) FILTER (WHERE outcome = 'executed') AS executed,
       min(request_id) FILTER (WHERE outcome = 'executed') AS first
  FROM awooop_refgw_request GROUP BY idempotency_key
"""

KNOWLEDGE_SQL = "SELECT entry_id FROM awooop_refgw_knowledge"
LOOP_ERRORS_SQL = (
    "SELECT run_id::text, reason, details ->> 'loop' AS loop FROM awooop_audit_log WHERE action = 'LOOP_ERROR'"
)
SCHEDULE_ERRORS_SQL = "SELECT project_id, name, last_error FROM awooop_schedule WHERE last_error IS NOT NULL"
# what happened on the way, for the soak's summary (that the crashes and races it is about occurred)
HAPPENINGS_SQL = """
SELECT action, count(*) AS n FROM awooop_audit_log
 WHERE action IN ('REAPED', 'WAIT_PARKED', 'WAIT_COMPLETED', 'WAIT_TIMED_OUT', 'WAIT_ENDED', 'RETRY_SCHEDULED',
                  'COMPENSATION_REQUESTED', 'CANCELLED')
 GROUP BY action
"""


async def happenings(dsn: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        return {r["action"]: r["n"] for r in await conn.fetch(HAPPENINGS_SQL)}
    finally:
        await conn.close()


@dataclass
class Submitted:
    """What the producers sent and what ingest acknowledged."""

    plans: dict[str, RunPlan] = field(default_factory=dict)  # event id -> plan, once sent
    acked: dict[str, str] = field(default_factory=dict)  # event id -> run id, once acknowledged
    acked_at: dict[str, float] = field(default_factory=dict)  # event id -> when it was acknowledged
    # run id -> what CancelRun answered a parent's planned cancel: "cancelled" (at once),
    # "requested" (it was leased: it may still end as planned) or "refused" (it had ended)
    cancels: dict[str, str] = field(default_factory=dict)

    def plan_of_run(self) -> dict[str, RunPlan]:
        return {run_id: self.plans[event_id] for event_id, run_id in self.acked.items()}


def entry_of(run_id: str, step_id: str) -> str:
    """tests/soak_waits_worker.py's knowledge entry of a run's tool step."""
    return f"ws-{run_id}-{step_id}"


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


async def check_store(dsn: str, submitted: Submitted, tool_actor: str, violations: Violations) -> dict[str, int]:
    """The end state, by the rules above; returns how the runs ended ("url: COMPLETED", ...)."""
    conn = await asyncpg.connect(dsn)
    try:
        runs = {r["run_id"]: r for r in await conn.fetch(RUNS_SQL)}
        waits = await conn.fetch(WAITS_SQL)
        steps: dict[str, list[Any]] = collections.defaultdict(list)
        for s in await conn.fetch(STEPS_SQL):
            steps[s["run_id"]].append(s)
        tools = {r["idempotency_key"]: r for r in await conn.fetch(TOOL_RUNS_SQL)}
        knowledge = {r["entry_id"] for r in await conn.fetch(KNOWLEDGE_SQL)}
        loop_errors = await conn.fetch(LOOP_ERRORS_SQL)
        schedule_errors = await conn.fetch(SCHEDULE_ERRORS_SQL)
    finally:
        await conn.close()

    plans = submitted.plan_of_run()
    children: dict[str, list[Any]] = collections.defaultdict(list)
    for r in runs.values():
        if r["parent_run_id"]:
            children[r["parent_run_id"]].append(r)
    ended: collections.Counter[str] = collections.Counter()
    for run_id, r in runs.items():
        plan = plans.get(run_id)
        kind = plan.kind if plan else ("child" if r["parent_run_id"] else "schedule")
        ended[f"{kind}: {r['status']} {r['error_code'] or ''}".strip()] += 1
        name = f"run {run_id} ({r['project_id']}, {kind})"
        if r["status"] not in TERMINAL:
            violations.add("run not terminal at the end", f"{name}: {r['status']}")
            continue
        if r["ends"] != 1:
            violations.add("run did not end exactly once", f"{name}: {r['ends']} terminal audit rows")
        parent = runs.get(r["parent_run_id"]) if r["parent_run_id"] else None
        cancel = submitted.cancels.get(run_id, "")
        if not parent or parent["status"] != "CANCELLED" or r["status"] != "CANCELLED":  # cancelled with it
            _check_outcome(r, plan, children.get(run_id, []), name, cancel, violations)
        # a completed child of a parent that did not complete is undone with its parent
        undone = r["status"] != "COMPLETED" or (parent is not None and parent["status"] != "COMPLETED")
        _check_saga(r, steps.get(run_id, []), knowledge, undone, name, violations)
    _check_order(runs, steps, children, tools, violations)
    for key, t in tools.items():
        if t["executed"] > 1:
            violations.add("a tool call ran twice (one idempotency key, two executions)", f"{key}: {t['executed']}x")
    for w in waits:
        if w["endings"] > 1:
            violations.add("a wait ended more than once", f"run {w['run_id']} wait {w['step_id']}: {w['endings']}x")
        _check_wait(w, plans.get(w["run_id"]), tool_actor, violations)
    for parent_id, kids in children.items():
        plan = plans.get(parent_id)
        want = len(plan.children) if plan else None
        if want is not None and len(kids) != want:
            violations.add("a parent's children started other than once each", f"{parent_id}: {len(kids)} of {want}")
    by_event = collections.Counter(r["provider_event_id"] for r in runs.values() if not r["parent_run_id"])
    for event_id, run_id in submitted.acked.items():
        if by_event.get(event_id) != 1 or run_id not in runs:
            violations.add("acknowledged event without exactly its one run", f"{event_id}: {by_event.get(event_id)}")
    for event_id, n in by_event.items():
        if not event_id.startswith("schedule:") and event_id not in submitted.plans:
            violations.add("run nobody submitted", f"{event_id}: {n} runs")
    for e in loop_errors:
        violations.add(
            "a background loop recorded a failure on a run", f"{e['loop']}: run {e['run_id']}: {e['reason']}"
        )
    for e in schedule_errors:
        violations.add("a schedule recorded an error", f"{e['project_id']}/{e['name']}: {e['last_error']}")
    return dict(sorted(ended.items()))


def _check_outcome(
    r: Any, plan: RunPlan | None, kids: list[Any], name: str, cancel: str, violations: Violations
) -> None:
    """Ended as its plan says (or failed by the reaper's attempts, whatever the plan); a parent its
    operator cancelled ended CANCELLED (or, the cancel only requested of its leased worker, as
    planned; refused, the run had ended as planned)."""
    if r["status"] == "FAILED" and r["error_code"] == wp.MAX_ATTEMPTS_CODE:
        return
    if cancel in ("cancelled", "requested") and r["status"] == "CANCELLED":
        return
    if cancel == "cancelled":
        violations.add("a cancelled parent did not end CANCELLED", f"{name}: {r['status']}")
        return
    if plan is None:  # a schedule tick completes; a child ends as its own plan says
        own = _json(r["plan"]) or {}
        want = ("FAILED", wp.FATAL_CODE) if own.get("outcome") == "fatal" else ("COMPLETED", "")
    else:
        want = wp.expected(plan, all(k["status"] == "COMPLETED" for k in kids))
    got = (r["status"], r["error_code"] or "")
    if got != want:
        violations.add("run ended against its plan", f"{name}: {got}, planned {want}")
        return
    if plan is not None and plan.kind in ("url", "rpc") and got[0] == "COMPLETED":
        output = _json(r["output"]) or {}
        posted = output.get("posted", {})
        if posted != {"verdict": plan.verdict, "by": plan.kind}:
            violations.add("a wait's run completed without the outcome its plan posts", f"{name}: {posted}")
        if plan.flaky_after and output.get("outcome_action") != "skip":
            violations.add("an outcome received before a failure not read from the journal", f"{name}: {output}")


def _check_wait(w: Any, plan: RunPlan | None, tool_actor: str, violations: Violations) -> None:
    """Who ended a wait: the URL, the tool key's RPC, or (timing out) the sweep."""
    if plan is None or w["status"] == "open":
        return
    if plan.kind == "timeout":
        want = ("timed_out", SWEEP_ACTOR)
    elif plan.kind == "url":
        want = ("completed", URL_ACTOR)
    elif plan.kind == "rpc":
        want = ("completed", tool_actor)
    else:
        return
    if (w["status"], w["completed_by"]) != want:
        got = (w["status"], w["completed_by"])
        violations.add("a wait ended by another path than its plan's", f"run {w['run_id']} ({plan.kind}): {got}")


def _check_saga(r: Any, steps: list[Any], knowledge: set[str], undone: bool, name: str, violations: Violations) -> None:
    """A failed run's completed tool steps are compensated (their entries deleted), and so are a
    completed child's whose parent failed (undone); a completed run keeps them, its saga closed."""
    tool_steps = [s for s in steps if s["compensatable"] and s["status"] not in ("pending", "failed")]
    if not undone:
        if r["saga_status"] != "not_needed":
            violations.add("completed run's saga not closed", f"{name}: {r['saga_status']}")
        for s in tool_steps:
            if s["status"] != "completed" or entry_of(r["run_id"], s["step_id"]) not in knowledge:
                violations.add("completed run's side effect missing", f"{name}: {s['step_id']} {s['status']}")
        return
    if tool_steps and (r["saga_status"] != "compensated" or any(s["status"] != "compensated" for s in tool_steps)):
        states = {s["step_id"]: s["status"] for s in tool_steps}
        violations.add("undone run's tool steps not compensated", f"{name}: saga {r['saga_status']}, {states}")
    for s in tool_steps:
        if entry_of(r["run_id"], s["step_id"]) in knowledge:
            violations.add("compensated run's side effect still there", f"{name}: {s['step_id']}")
    if not tool_steps and r["saga_status"] != "not_needed":
        violations.add("undone run with nothing to undo not marked not_needed", f"{name}: {r['saga_status']}")


def _check_order(
    runs: dict[str, Any],
    steps: dict[str, list[Any]],
    children: dict[str, list[Any]],
    tools: dict[str, Any],
    violations: Violations,
) -> None:
    """The order of the compensations the gateway ran: each run's steps newest first; a failed
    parent's completed children (newest first) before its own steps."""

    def undone(run_id: str) -> list[tuple[int, int]]:
        """(seq, when) of each of the run's compensated steps, newest step first."""
        out = []
        for s in reversed(steps.get(run_id, [])):
            t = tools.get(f"{run_id}:{s['step_id']}:compensate")
            if s["status"] == "compensated" and t is not None and t["first"] is not None:
                out.append((s["seq"], t["first"]))
        return out

    for run_id, r in runs.items():
        done = undone(run_id)
        if [w for _, w in done] != sorted(w for _, w in done):
            violations.add("a run's steps compensated out of order (not newest first)", f"{run_id}: {done}")
        if r["status"] not in ("FAILED", "CANCELLED"):
            continue
        kids = sorted((k for k in children.get(run_id, []) if k["status"] == "COMPLETED"), key=lambda k: k["child_seq"])
        firsts = [min((w for _, w in undone(k["run_id"])), default=None) for k in reversed(kids)]
        lasts = [max((w for _, w in undone(k["run_id"])), default=None) for k in reversed(kids)]
        own = [w for _, w in done]
        seen = [(f, last) for f, last in zip(firsts, lasts, strict=True) if f is not None and last is not None]
        if any(a[1] > b[0] for a, b in itertools.pairwise(seen)):
            violations.add(
                "a failed parent's children compensated out of order (not newest first)", f"{run_id}: {seen}"
            )
        if own and seen and max(last for _, last in seen) > min(own):
            violations.add("a failed parent's own steps compensated before its children's", f"{run_id}")
