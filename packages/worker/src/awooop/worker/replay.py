"""Replay checks: a resumed handler must meet the journal its run's earlier attempts left.

A run that resumes (after an approval, a wait, a crash) runs the code deployed now, from the top,
and skips what the journal holds as completed. When that code is not the code that wrote the
journal (a deploy reordered, renamed, added or removed steps, or changed what a step is called
with), skipping by step id would silently skip the wrong work or repeat done work. So each
journaling call of a resumed attempt is checked against the journal as the attempt found it:

- a step id the journal holds must be called as the same kind of step, with the same tool, and,
  when the journal holds it completed, with the same parameters (their JSON, as journaled);
- the journal's completed steps, in journal order up to the first step an earlier attempt did
  not complete, are the prefix the code must replay in that order: a call of a later or a new
  step while one of them has not been reached, or a completion that never reached one, is a
  change of code. Past that first unfinished step the earlier attempt may have taken an error's
  path (a step failed, the handler caught it), so steps journaled after it need not come again.

A mismatch raises Nondeterminism; the worker then holds the run (HoldRun) instead of failing it:
an operator decides (UnholdRun after deploying code that replays it, or CancelRun to end and
compensate it). docs/worker-sdk.md, "Replay and deploys".

Patches (ctx.patched) are journaled as markers (PATCH_PREFIX): answers, not steps, so they are
left out of the check. A patch asked for the first time while the journal holds steps this
attempt has not reached yet was passed by an earlier attempt, under code without it (code with it
would have journaled its answer there): its answer is False.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from awooop.common.v1 import common_pb2
from awooop.worker.structs import from_struct, to_struct

# the run's error_code while it is held for a mismatch (HoldRun)
NONDETERMINISM_CODE = "E-WORKER-NONDETERMINISM"
# the step ids of ctx.patched's markers: the journaled answers of patches, not steps of the code
# (they are journaled where the question was first asked, and a retired patch asks no more)
PATCH_PREFIX = "patch:"

_KINDS: dict[int, str] = {
    common_pb2.STEP_TYPE_LLM_CALL: "llm_call",
    common_pb2.STEP_TYPE_TOOL_CALL: "tool_call",
    common_pb2.STEP_TYPE_APPROVAL_REQUEST: "approval_request",
    common_pb2.STEP_TYPE_CALLBACK: "callback",
}


class Nondeterminism(Exception):
    """The handler's code does not replay the run's journal. The worker holds the run; every
    later call of the handler on this run raises this again."""

    def __init__(self, run_id: str, step_id: str, what: str) -> None:
        super().__init__(f"run {run_id} does not replay its journal at step {step_id!r}: {what}")
        self.run_id = run_id
        self.step_id = step_id


def _call(kind: int, tool_id: str) -> str:
    name = _KINDS.get(kind, str(kind))
    return f"{name} {tool_id}" if tool_id else name


def _normal(params: Mapping[str, Any]) -> Any:
    """Parameters as the journal holds them (a Struct: numbers are floats, whole ones come back int)."""
    return from_struct(to_struct(dict(params)))


class ReplayCheck:
    """One resumed attempt's check against the journal it found (the steps as GetJournal gave them)."""

    def __init__(self, run_id: str, steps: Sequence[common_pb2.SagaStep]) -> None:
        self.run_id = run_id
        ordered = sorted((s for s in steps if not s.step_id.startswith(PATCH_PREFIX)), key=lambda s: s.seq)
        self._steps = {s.step_id: s for s in ordered}
        self._prefix: list[common_pb2.SagaStep] = []
        for s in ordered:
            if s.status != common_pb2.STEP_STATUS_COMPLETED:
                break
            self._prefix.append(s)
        self._reached: set[str] = set()

    def reach(self, step_id: str, kind: int, tool_id: str = "", params: Mapping[str, Any] | None = None) -> None:
        """The handler journals step_id (kind, tool, parameters; None: a step without parameters
        of its own, an approval or a wait). Raises Nondeterminism when the journal disagrees."""
        known = self._steps.get(step_id)
        if known is not None:
            if (known.step_type, known.tool_id) != (kind, tool_id):
                raise Nondeterminism(
                    self.run_id,
                    step_id,
                    f"journaled (step {known.seq}) as {_call(known.step_type, known.tool_id)},"
                    f" called now as {_call(kind, tool_id)}",
                )
            completed = known.status == common_pb2.STEP_STATUS_COMPLETED
            if completed and params is not None and _normal(params) != from_struct(known.tool_params):
                raise Nondeterminism(
                    self.run_id,
                    step_id,
                    f"journaled (step {known.seq}, completed) with other parameters than it is called with now",
                )
        if step_id in self._reached:
            return
        before = [s for s in self._prefix if s.step_id not in self._reached and (known is None or s.seq < known.seq)]
        if before:
            first = before[0]
            where = "a step the journal does not hold" if known is None else f"journaled as step {known.seq}"
            raise Nondeterminism(
                self.run_id,
                step_id,
                f"called ({where}) before step {first.seq}, {first.step_id!r}, which an earlier attempt"
                " completed before it and this code has not reached",
            )
        self._reached.add(step_id)

    def at_frontier(self) -> bool:
        """Every journaled step was reached: no earlier attempt went further than this point (a
        patch asked here, and never answered before, takes the new path)."""
        return all(step_id in self._reached for step_id in self._steps)

    def finish(self) -> None:
        """The handler completes the run: every step of the replayed prefix must have been reached."""
        missing = [s for s in self._prefix if s.step_id not in self._reached]
        if missing:
            first = missing[0]
            raise Nondeterminism(
                self.run_id,
                first.step_id,
                f"step {first.seq}, which an earlier attempt completed, was never reached: the code completes"
                f" the run without it ({len(missing)} journaled step(s) not reached)",
            )
