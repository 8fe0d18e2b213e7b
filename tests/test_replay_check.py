"""The replay rule of the Python SDK (awooop.worker.replay), case by case, on journals as
GetJournal returns them. The TypeScript SDK's unit tests hold the same cases
(packages/worker-ts/test/unit/replay.test.ts). The end-to-end behaviour (the run held, the
operator's ways out) is in tests/test_replay.py."""

from __future__ import annotations

from typing import Any

import pytest

from awooop.common.v1 import common_pb2
from awooop.worker.replay import Nondeterminism, ReplayCheck
from awooop.worker.structs import to_struct

CALLBACK, TOOL, LLM, APPROVAL = (
    common_pb2.STEP_TYPE_CALLBACK,
    common_pb2.STEP_TYPE_TOOL_CALL,
    common_pb2.STEP_TYPE_LLM_CALL,
    common_pb2.STEP_TYPE_APPROVAL_REQUEST,
)
DONE, PENDING, FAILED = (
    common_pb2.STEP_STATUS_COMPLETED,
    common_pb2.STEP_STATUS_PENDING,
    common_pb2.STEP_STATUS_FAILED,
)


def step(seq: int, step_id: str, kind: int = CALLBACK, status: int = DONE, tool: str = "", **params: Any) -> Any:
    s = common_pb2.SagaStep(step_id=step_id, seq=seq, step_type=kind, status=status, tool_id=tool)
    if params:
        s.tool_params.CopyFrom(to_struct(params))
    return s


def check(*steps: Any) -> ReplayCheck:
    return ReplayCheck("r1", list(steps))


def test_the_same_code_replays_in_order_and_may_go_on_with_new_steps() -> None:
    c = check(step(1, "a", TOOL, tool="scale", replicas=3), step(2, "b", LLM), step(3, "approval", APPROVAL, PENDING))
    c.reach("a", TOOL, "scale", {"replicas": 3})
    c.reach("b", LLM, "", {})
    c.reach("a", TOOL, "scale", {"replicas": 3})  # a second call of a reached step: no order question
    c.reach("approval", APPROVAL)
    assert c.at_frontier()
    c.reach("c", TOOL, "scale", {"replicas": 5})  # after the journal: new work


def test_whole_numbers_compare_as_the_journal_keeps_them() -> None:
    check(step(1, "a", TOOL, tool="scale", replicas=3, ratio=0.5)).reach(
        "a", TOOL, "scale", {"replicas": 3.0, "ratio": 0.5}
    )


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (("a", LLM, "", {}), "as tool_call scale, called now as llm_call"),
        (("a", TOOL, "resize", {"replicas": 3}), "as tool_call scale, called now as tool_call resize"),
        (("a", TOOL, "scale", {"replicas": 4}), "other parameters"),
        (("a2", TOOL, "scale", {"replicas": 3}), "a renamed step would do its work twice"),
    ],
)
def test_a_changed_kind_tool_or_parameter_or_a_renamed_tool_call_is_nondeterminism(
    call: tuple[str, int, str, dict[str, Any]], says: str
) -> None:
    c = check(step(1, "a", TOOL, tool="scale", replicas=3), step(2, "b"))
    with pytest.raises(Nondeterminism) as found:
        c.reach(*call)
    assert says in str(found.value) and found.value.step_id == call[0]


def test_a_reorder_and_an_insertion_are_found_where_they_happen() -> None:
    c = check(step(1, "fetch", LLM), step(2, "plan"), step(3, "apply"))
    c.reach("plan", CALLBACK, "", {})  # fetch skipped: fine so far
    with pytest.raises(Nondeterminism, match=r"journaled as step 1, before step 2 \('plan'\), but called after it"):
        c.reach("fetch", LLM, "", {})
    c = check(step(1, "fetch", LLM), step(2, "plan"))
    c.reach("fetch", LLM, "", {})
    c.reach("check", CALLBACK, "", {})  # new work...
    with pytest.raises(Nondeterminism, match=r"called before step 2 \('plan'\)") as found:
        c.reach("plan", CALLBACK, "", {})  # ...before a step an earlier attempt completed without it
    assert found.value.step_id == "check"


def test_a_step_the_code_skips_on_a_replay_is_no_change() -> None:
    """The documented hand-out: a wait's callback URL is handed out by the attempt that created the
    wait only; later attempts skip that step and go on."""
    c = check(
        step(1, "a", TOOL, tool="scale"), step(2, "wait-1"), step(3, "hand-out"), step(4, "b", TOOL, tool="notify")
    )
    c.reach("a", TOOL, "scale", {})
    c.reach("wait-1", CALLBACK, ordered=False)
    c.reach("wait-1:outcome", CALLBACK, ordered=False)
    c.reach("b", TOOL, "notify", {})
    assert not c.at_frontier()  # "hand-out" was not reached: a patch asked here answers False


def test_the_sdks_own_entries_are_checked_by_kind_only() -> None:
    """A wait created inside a step that is skipped now (a parked tool call) is not made again; an
    entry journaled late (a crash between the wait's creation and its entry) is not out of order."""
    c = check(step(1, "a"), step(2, "deploy", TOOL, tool="run"), step(3, "deploy:wait"), step(4, "b"))
    c.reach("a", CALLBACK, "", {})
    c.reach("deploy", TOOL, "run", {})  # completed: its function (which creates the wait) is skipped
    c.reach("b", CALLBACK, "", {})
    c = check(step(1, "a"), step(2, "hand-out"), step(3, "cb"))
    c.reach("a", CALLBACK, "", {})
    c.reach("cb", CALLBACK, ordered=False)
    c.reach("hand-out", CALLBACK, "", {})
    with pytest.raises(Nondeterminism, match="called now as tool_call"):
        c.reach("cb", TOOL, "x", {}, ordered=False)


def test_after_a_step_an_earlier_attempt_did_not_complete_the_code_may_take_another_path() -> None:
    """Attempt 1: "a" failed, the handler caught it and ran "fallback". Attempt 2 retries "a",
    which succeeds, and goes on without "fallback"."""
    c = check(step(1, "prep"), step(2, "a", TOOL, FAILED, tool="scale", replicas=1), step(3, "fallback"))
    c.reach("prep", CALLBACK, "", {})
    c.reach("a", TOOL, "scale", {"replicas": 2})  # a retry may be called with other parameters
    c.reach("report", CALLBACK, "", {})
    with pytest.raises(Nondeterminism, match="called now as llm_call"):  # but not as another kind of step
        c.reach("fallback", LLM, "", {})


def test_patch_markers_are_answers_not_steps() -> None:
    c = check(step(1, "a"), step(2, "patch:x"), step(3, "b"))
    c.reach("a", CALLBACK, "", {})
    c.reach("b", CALLBACK, "", {})
    assert c.at_frontier()
