"""What a durable wait's ending answers: the one reading of awooop_end_wait's row (migration 0160)
for both paths that end a wait by hand, the scheduler's CompleteWait RPC and ingest's callback URL
(services/scheduler/waits.py, services/ingest/wait_callbacks.py)."""

from __future__ import annotations

from prometheus_client import Counter

from services.common import errors
from services.common.db import Row
from services.common.observability import preset
from services.common.runstate import TERMINAL, TRANSITIONS, Action, WaitKind, WaitStatus

# what ended waits, counted by the process that ended them (the scheduler: CompleteWait,
# ExpireWait, the timeout sweep and the event matcher; ingest: the callback URL). "cancelled":
# the wait's run had ended before it (cancelled or failed), and the sweep closed it timed out.
ENDED = Counter("awooop_waits_ended_total", "Durable waits ended, by outcome", ["outcome"])
CANCELLED = "cancelled"
preset(ENDED, (WaitStatus.COMPLETED, WaitStatus.TIMED_OUT, CANCELLED))


def count(row: Row) -> None:
    """Counts a row of awooop_end_wait that ended its wait (outcome ended or expired) in ENDED."""
    if row["outcome"] not in ("ended", "expired"):
        return
    over = row["run_status"] in {s.value for s in TERMINAL}
    ENDED.labels(CANCELLED if over else row["wait_status"]).inc()


def ended(row: Row, wait_id: str, action: Action = Action.COMPLETE_WAIT) -> Row:
    """The row when this call decided the wait; else its refusal: NOT_FOUND (no such wait in the
    caller's projects), WAIT_CLOSED naming the first outcome (or a sleep, which takes no
    completion), INVALID_TRANSITION naming the run's status when the wait's run is over (action:
    what the call tried, COMPLETE_WAIT or, by hand, EXPIRE_WAIT). Counts an ended wait (ENDED)."""
    count(row)
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
    # the run is over: the table's refusal (runstate COMPLETE_WAIT and EXPIRE_WAIT are allowed
    # from CANCELLABLE only)
    raise errors.invalid_transition(str(row["run_id"]), row["run_status"], TRANSITIONS[action].describe)
