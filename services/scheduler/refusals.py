"""The choice of error when a fenced write changed nothing (the statements are in
fenced_writes.sql, claims.sql and approvals.sql; each returns the locked row's state as cur_*)."""

from __future__ import annotations

from services.common import errors, runstate
from services.common.db import Row
from services.common.runstate import Refusal


def lease_was_reaped(cur: Row) -> bool:
    """The current attempt's lease was taken by the reaper: it stamps reaped_at after the
    claim stamped heartbeat_at (a later claim stamps heartbeat_at again)."""
    reaped, beat = cur["cur_reaped_at"], cur["cur_heartbeat_at"]
    return reaped is not None and (beat is None or reaped >= beat)


def fenced_refusal(cur: Row, run_id: str, attempt: int, action: str) -> errors.ServiceError:
    """The error runstate.fenced_refusal chooses for the locked row `cur`."""
    status = cur["cur_status"]
    refusal = runstate.fenced_refusal(status, cur["cur_attempt"] == attempt, lease_was_reaped(cur))
    if refusal is Refusal.LEASE_LOST:
        return errors.lease_lost(run_id, attempt)
    return errors.invalid_transition(run_id, status, action)
