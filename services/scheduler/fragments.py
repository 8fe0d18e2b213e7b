"""SQL pieces shared by the scheduler's statements, and the choice of error when a fenced
write changed nothing.

Every state change is one statement: a data-modifying CTE `upd` makes the change, and
sibling CTEs record a compensation request (`comp`), write the audit rows (`aud`) and send
the wake-up NOTIFY (`notified`) in the same statement, so in the same transaction.
"""

from __future__ import annotations

from services.common import errors, runstate
from services.common.compensatable import compensatable_step
from services.common.db import Row
from services.common.runs import RUN_COLUMNS
from services.common.runstate import COMPENSATABLE, DROP_LEASE, Audit, Refusal, sql_list

# RUN_COLUMNS qualified with the UPDATE target alias `r` (the statements join other CTEs
# that share column names).
RUN_COLUMNS_R = ", ".join(f"r.{c.strip()}" for c in RUN_COLUMNS.split(","))

# The locked row's state a fenced write reads to choose its error (`cur` CTE; prefixed so
# it does not clash with the changed row's columns).
CUR_COLUMNS = """run_id AS cur_run_id, project_id AS cur_project, status AS cur_status, attempt_count AS cur_attempt,
           cancel_requested AS cur_cancel, reaped_at AS cur_reaped_at, heartbeat_at AS cur_heartbeat_at,
           worker_id AS cur_worker"""


def fence_where(attempt_sql: str, statuses_sql: str, projects_sql: str) -> str:
    """The fencing condition of a fenced UPDATE of `awooop_run_state r`: the token names the
    current attempt, the status allows the action, and the caller holds the role in the run's
    project (projects_sql NULL: every project).

    The status test is wrapped in `IS TRUE` (status is NOT NULL: same meaning) so the planner
    cannot match it to the predicate of awooop_run_leased_idx: believing that partial index
    nearly empty, it would scan all of it and compare every leased run with every item of a
    batch (CompleteRuns: leases held x batch) instead of one primary-key probe per item."""
    return f"""r.attempt_count = {attempt_sql}
       AND (r.status = ANY({statuses_sql})) IS TRUE
       AND ({projects_sql} IS NULL OR r.project_id = ANY({projects_sql}))"""


def complete_set(output_sql: str) -> str:
    """SET list of CompleteRun / CompleteRuns: RUNNING -> COMPLETED with the output, lease dropped.
    A completed run is never compensated (Compensate takes FAILED and CANCELLED runs only), so its
    saga ends here: not_needed. (Failed and cancelled runs with nothing to undo get not_needed from
    the trigger of migration 0080.)"""
    return f"""status = 'COMPLETED', output = {output_sql}, {DROP_LEASE},
           failure_reason = NULL, error_code = NULL, not_before = NULL, saga_status = 'not_needed'"""


# Audit row of a fenced write, per changed row of `upd` (which carries from_status and prev_worker).
FENCED_AUDIT_DETAILS = "jsonb_build_object('attempt', attempt_count, 'worker_id', prev_worker)"

# A run's journal has something to undo: a completed step with a compensation command.
HAS_COMPENSATABLE_STEPS = f"""EXISTS (SELECT 1 FROM awooop_saga_step s
                WHERE s.run_id = u.run_id AND {compensatable_step("s")})"""


def compensation_cte(trigger_sql: str) -> str:
    """CTE `comp`: the compensation requests recorded for the rows of `upd` that ended
    FAILED or CANCELLED with compensatable steps (docs/architecture.md, "Saga": the request is
    written in the same transaction as the state change; the saga service drives it to an
    end). trigger_sql is evaluated per row of `upd` aliased `u`. Put it before the audit
    CTE, which adds `comp_audit_rows` so the audit order is change, then request."""
    return f""",
comp AS (
    INSERT INTO awooop_compensation_request (run_id, project_id, trigger, reason)
    SELECT u.run_id, u.project_id, {trigger_sql}, u.failure_reason
      FROM upd u
     WHERE u.status IN ({sql_list(COMPENSATABLE)}) AND {HAS_COMPENSATABLE_STEPS}
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id, project_id, trigger
)"""


def comp_audit_rows(actor_sql: str) -> str:
    """UNION ALL branch of an audit INSERT ... SELECT: one COMPENSATION_REQUESTED row per
    recorded request (one INSERT keeps the audit rows in the order written)."""
    return f"""
    UNION ALL
    SELECT project_id, run_id, {actor_sql}, '{Audit.COMPENSATION_REQUESTED}', NULL, NULL, trigger,
           jsonb_build_object('trigger', trigger)
      FROM comp"""


def notify_cte(channel_param: str, condition: str) -> str:
    """CTE `notified`: one NOTIFY per project that got a claimable run (Postgres folds
    identical notifications of one transaction). The final SELECT must reference it,
    since a read-only CTE that nobody reads is not executed."""
    return f""",
notified AS (
    SELECT count(pg_notify({channel_param}, project_id)) AS n
      FROM (SELECT DISTINCT project_id FROM upd WHERE {condition}) p
)"""


# --- choosing the error of a fenced write that changed nothing ---------------------------


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
