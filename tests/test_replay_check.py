"""The replay rule of the Python SDK (awooop.worker.replay), case by case, on journals as
GetJournal returns them. The end-to-end behaviour (the run held, the operator's ways out) is in
tests/test_replay.py."""

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
    c.reach("c", CALLBACK, "", {"x": 1})  # after the journal: new work
    c.finish()


def test_whole_numbers_compare_as_the_journal_keeps_them() -> None:
    c = check(step(1, "a", TOOL, tool="scale", replicas=3, ratio=0.5))
    c.reach("a", TOOL, "scale", {"replicas": 3.0, "ratio": 0.5})
    c.finish()


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (("a", LLM, "", {}), "as tool_call scale, called now as llm_call"),
        (("a", TOOL, "resize", {"replicas": 3}), "as tool_call scale, called now as tool_call resize"),
        (("a", TOOL, "scale", {"replicas": 4}), "other parameters"),
        (("b", CALLBACK, "", {}), "before step 1, 'a'"),  # a reordered step
        (("new", CALLBACK, "", {}), "a step the journal does not hold"),  # a step added before journaled ones
    ],
)
def test_a_changed_kind_tool_parameter_order_or_an_inserted_step_is_nondeterminism(
    call: tuple[str, int, str, dict[str, Any]], says: str
) -> None:
    c = check(step(1, "a", TOOL, tool="scale", replicas=3), step(2, "b"))
    with pytest.raises(Nondeterminism) as found:
        c.reach(*call)
    assert says in str(found.value) and found.value.step_id == call[0]


def test_a_removed_step_is_found_at_the_next_journaled_call_or_at_completion() -> None:
    c = check(step(1, "a"), step(2, "b"), step(3, "c"))
    c.reach("a", CALLBACK, "", {})
    with pytest.raises(Nondeterminism, match="before step 2, 'b'"):
        c.reach("c", CALLBACK, "", {})
    tail = check(step(1, "a"), step(2, "b"))
    tail.reach("a", CALLBACK, "", {})
    with pytest.raises(Nondeterminism, match="never reached"):
        tail.finish()


def test_after_a_step_an_earlier_attempt_did_not_complete_the_code_may_take_another_path() -> None:
    """Attempt 1: "a" failed, the handler caught it and ran "fallback". Attempt 2 retries "a",
    which succeeds, and goes on without "fallback": the error's path is not the code's."""
    c = check(step(1, "prep"), step(2, "a", TOOL, FAILED, tool="scale", replicas=1), step(3, "fallback"))
    c.reach("prep", CALLBACK, "", {})
    c.reach("a", TOOL, "scale", {"replicas": 2})  # a retry may be called with other parameters
    c.reach("report", CALLBACK, "", {})
    c.finish()
    with pytest.raises(Nondeterminism, match="called now as llm_call"):  # but not as another kind of step
        c.reach("fallback", LLM, "", {})


def test_a_pending_step_is_retried_and_the_prefix_stops_before_it() -> None:
    c = check(step(1, "a"), step(2, "b", TOOL, PENDING, tool="scale"), step(3, "c"))
    with pytest.raises(Nondeterminism, match="before step 1, 'a'"):
        c.reach("b", TOOL, "scale", {})
    c = check(step(1, "a"), step(2, "b", TOOL, PENDING, tool="scale"), step(3, "c"))
    c.reach("a", CALLBACK, "", {})
    c.reach("b", TOOL, "scale", {})
    c.finish()  # "c" followed a step that had not completed: not required
