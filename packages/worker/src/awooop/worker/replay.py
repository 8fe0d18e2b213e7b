"""Replay checks: a resumed handler must meet the journal its run's earlier attempts left.

A run that resumes (after an approval, a wait, a crash) runs the code deployed now, from the top,
and skips what the journal holds as completed. When that code is not the code that wrote the
journal (a deploy reordered, renamed or inserted steps, or changed what a step is called with),
skipping by step id would silently skip the wrong work or repeat done work. So each journaling
call of a resumed attempt is checked against the journal as the attempt found it:

- a step id the journal holds must be called as the same kind of step, with the same tool, and,
  when the journal holds it completed, with the same parameters (their JSON, as journaled);
- the steps the handler calls itself (ctx.step, approvals) must come in journal order: one
  journaled before a step already reached is a reorder;
- new work must not come before journaled work: a step the journal does not hold, called before
  a step an earlier attempt completed later, is an insertion; and a new step called exactly as a
  completed step the replay has not reached (same kind, tool and parameters, another id) is that
  step renamed, which would do its work twice (tool calls: the steps with side effects).

A journaled step the new code does not call again is not by itself a change: handlers skip steps
on a replay for reasons of their own (a wait's callback URL is handed out only by the attempt that
created the wait). The SDK's own entries (a durable wait's creation and outcome, a fan-in of child
runs) are checked by kind only: they are journaled around the calls that make them, and one made
inside a step is not made again when that step is skipped.

A mismatch raises Nondeterminism; the worker then holds the run (HoldRun) instead of failing it:
an operator decides (UnholdRun after deploying code that replays it, or CancelRun to end and
compensate it). docs/worker-sdk.md, "Replay and deploys".

Patches (ctx.patched) are journaled as markers (PATCH_PREFIX): answers, not steps, so they are
left out. A patch asked for the first time while the journal holds entries this attempt has not
reached was passed by an earlier attempt, under code without it (code with it would have journaled
its answer there): its answer is False.
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
        self._reached: set[str] = set()
        self._last: common_pb2.SagaStep | None = None  # the latest journaled step the handler reached
        self._new: str | None = None  # a step the journal does not hold, called since then

    def reach(
        self,
        step_id: str,
        kind: int,
        tool_id: str = "",
        params: Mapping[str, Any] | None = None,
        *,
        ordered: bool = True,
    ) -> None:
        """The handler journals step_id (kind, tool, parameters; None: a step without parameters
        of its own, an approval or a wait). ordered: a step the handler calls itself (not the
        SDK's entry of a wait or a fan-in). Raises Nondeterminism when the journal disagrees."""
        known = self._steps.get(step_id)
        if known is not None:
            self._same_call(known, step_id, kind, tool_id, params)
        if ordered and step_id not in self._reached:
            if known is None:
                self._renamed(step_id, kind, tool_id, params)
                self._new = self._new or step_id
            else:
                self._in_order(known)
                self._last, self._new = known, None
        self._reached.add(step_id)

    def _same_call(
        self, known: common_pb2.SagaStep, step_id: str, kind: int, tool_id: str, params: Mapping[str, Any] | None
    ) -> None:
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

    def _in_order(self, known: common_pb2.SagaStep) -> None:
        last = self._last
        if last is not None and known.seq < last.seq:
            raise Nondeterminism(
                self.run_id,
                known.step_id,
                f"journaled as step {known.seq}, before step {last.seq} ('{last.step_id}'), but called after it",
            )
        if self._new is not None and known.status == common_pb2.STEP_STATUS_COMPLETED:
            raise Nondeterminism(
                self.run_id,
                self._new,
                f"a step the journal does not hold, called before step {known.seq} ('{known.step_id}'),"
                " which an earlier attempt completed without it",
            )

    def _renamed(self, step_id: str, kind: int, tool_id: str, params: Mapping[str, Any] | None) -> None:
        """Only tool calls: the steps whose repeat is a side effect done twice."""
        if kind != common_pb2.STEP_TYPE_TOOL_CALL:
            return
        call = _normal(params or {})
        for s in self._steps.values():
            if (
                s.step_id not in self._reached
                and s.status == common_pb2.STEP_STATUS_COMPLETED
                and (s.step_type, s.tool_id) == (kind, tool_id)
                and from_struct(s.tool_params) == call
                and (self._last is None or s.seq > self._last.seq)
            ):
                raise Nondeterminism(
                    self.run_id,
                    step_id,
                    f"not in the journal, but called as step {s.seq} ('{s.step_id}') was, which an earlier"
                    " attempt completed and this code has not reached: a renamed step would do its work twice",
                )

    def at_frontier(self) -> bool:
        """Every journaled entry was reached: no earlier attempt went further than this point (a
        patch asked here, and never answered before, takes the new path)."""
        return all(step_id in self._reached for step_id in self._steps)
