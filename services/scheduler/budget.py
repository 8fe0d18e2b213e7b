"""Answers that fit the message limit (AWOOOP_MAX_MESSAGE_BYTES).

Every single run fits one answer: its input and output are each at most
AWOOOP_MAX_PAYLOAD_BYTES as JSON and encoded (services/common/jsonvalues.py), and the start-up
check (settings.deliverability_problem) keeps the message limit above two payloads plus the
other fields. Many runs may not, so:

- ClaimRuns takes the runs its answer has room for, oldest first, and hands the others back at
  once (hand_back.py: the attempt does not count, the run is claimable again, the next claim
  gets it). Before this, an answer over the limit failed in transport
  after the claim committed, and the runs were reaped until their attempts ran out without
  ever having run.
- ListRuns ends its page at the last run that fits (next_page_token continues after it).
- GetRunHistory answers RESOURCE_EXHAUSTED / HISTORY_TOO_LARGE instead of failing in transport.
- StartChildRuns answers every child; past the budget a child's output is left out and marked
  output_omitted (the SDK reads it with GetRun). GetRun lists the children that fit.
- CompleteRuns (and ClaimRuns.complete) answer every item; past the budget a completed run is
  returned without its input and output (the caller has them; GetRun reads them), so a large
  batch never makes its own answer undeliverable after its writes committed.
"""

from __future__ import annotations

from collections.abc import Sequence

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2

# GetRunHistory past the limit (it has no pages: a run's history is short unless its reasons are huge)
HISTORY_TOO_LARGE = "HISTORY_TOO_LARGE"

# room for the answer's other fields, framing and trailers
HEADROOM = 16 * 1024
# per repeated item: tag, length prefix
ITEM_FRAMING = 8


def answer_budget(max_message_bytes: int) -> int:
    return max(0, max_message_bytes - HEADROOM)


def fit_claimed(claimed: Sequence[scheduler_pb2.ClaimedRun], budget: int) -> int:
    """How many of claimed (oldest first) fit in budget bytes (one always fits an empty
    answer: settings.deliverability_problem)."""
    used = 0
    for i, c in enumerate(claimed):
        used += c.ByteSize() + ITEM_FRAMING
        if used > budget:
            return i
    return len(claimed)


def fit_runs(runs: Sequence[common_pb2.Run], budget: int) -> int:
    """How many of runs (in page order) fit in budget bytes; at least one when any is given."""
    used = 0
    for i, r in enumerate(runs):
        used += r.ByteSize() + ITEM_FRAMING
        if used > budget and i > 0:
            return i
    return len(runs)


def fit_children(children: Sequence[scheduler_pb2.ChildRun], budget: int) -> None:
    """StartChildRuns' answer: a child's output past budget (in order) is left out and marked
    `output_omitted` (GetRun reads it), so a fan-in of many large outputs stays deliverable."""
    used = 0
    for c in children:
        size = c.ByteSize() + ITEM_FRAMING
        if used + size > budget and c.HasField("output"):
            c.ClearField("output")
            c.output_omitted = True
            size = c.ByteSize() + ITEM_FRAMING
        used += size


def fit_refs(refs: Sequence[scheduler_pb2.ChildRunRef], budget: int) -> int:
    """How many of GetRun's child references fit in budget bytes."""
    used = 0
    for i, r in enumerate(refs):
        used += r.ByteSize() + ITEM_FRAMING
        if used > budget:
            return i
    return len(refs)


def trim_results(results: Sequence[scheduler_pb2.CompleteRunResult], budget: int) -> int:
    """Clears input and output of the completed runs past budget (in item order); returns
    the bytes the results use afterwards."""
    used = 0
    for r in results:
        size = r.ByteSize() + ITEM_FRAMING
        if used + size > budget and r.HasField("run"):
            r.run.ClearField("input")
            r.run.ClearField("output")
            size = r.ByteSize() + ITEM_FRAMING
        used += size
    return used
