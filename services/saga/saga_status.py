"""Writes of a run's saga_status (in_progress -> compensating -> compensated |
compensation_failed), shared by the driver and the operator actions."""

from __future__ import annotations

# The compensation of the run starts (or starts again, after RetryCompensation): $1 run_id.
SET_COMPENSATING_SQL = """
UPDATE awooop_run_state
   SET saga_status = 'compensating', compensation_started_at = COALESCE(compensation_started_at, now()),
       compensation_completed_at = NULL, updated_at = now()
 WHERE run_id = $1
"""
