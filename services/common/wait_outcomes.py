"""What a durable wait's ending answers: the one reading of awooop_end_wait's row (migration 0160)
for both paths that end a wait by hand, the scheduler's CompleteWait RPC and ingest's callback URL
(services/scheduler/waits.py, services/ingest/wait_callbacks.py)."""

from __future__ import annotations

from services.common import errors
from services.common.db import Row
from services.common.runstate import TRANSITIONS, Action, WaitKind, WaitStatus


def ended(row: Row, wait_id: str) -> Row:
    """The row when this call decided the wait; else its refusal: NOT_FOUND (no such wait in the
    caller's projects), WAIT_CLOSED naming the first outcome (or a sleep, which takes no
    completion), INVALID_TRANSITION when the wait's run is over."""
    outcome = row["outcome"]
    if outcome == "ended":
        return row
    if outcome == "not_found":
        raise errors.not_found("wait", wait_id)
    if outcome == "not_a_token":
        raise errors.wait_closed(
            wait_id, f"wait {wait_id} is a sleep: it ends only when its time is up", kind=WaitKind.SLEEP
        )
    if outcome == "expired":
        raise errors.wait_closed(
            wait_id, f"wait {wait_id} timed out at {row['expires_at'].isoformat()}", outcome=WaitStatus.TIMED_OUT
        )
    if outcome == "closed":
        first = row["wait_status"]
        by = f" by {row['completed_by']}" if row["completed_by"] else ""
        at = f" at {row['completed_at'].isoformat()}" if row["completed_at"] else ""
        raise errors.wait_closed(wait_id, f"wait {wait_id} already {first}{by}{at}", outcome=first)
    # the run is over: the table's refusal (runstate COMPLETE_WAIT is allowed from CANCELLABLE only)
    raise errors.invalid_transition(str(row["run_id"]), row["run_status"], TRANSITIONS[Action.COMPLETE_WAIT].describe)
