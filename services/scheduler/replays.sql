-- Retried worker writes (services/scheduler/replays.py): reads that recognise a write whose first
-- attempt committed, so its repeat by the same lease answers the same success. They run only on
-- the refusal path (the write changed nothing); the details keys they look for are written by the
-- statements of fenced_writes.sql (FailRun: `retryable`; ReleaseRun: `released`).

-- name: CurrentRuns :many
-- The runs as they are now (the run columns and the compensation request's trigger).
SELECT *,
       (SELECT trigger FROM awooop_compensation_request c WHERE c.run_id = r.run_id) AS comp_trigger
  FROM awooop_run_state r
 WHERE run_id = ANY(:run_ids::uuid[])

-- name: FailedBy :val
-- The holder of :attempt failed :run_id (only FailRun writes `retryable` into its details).
SELECT EXISTS (
    SELECT 1 FROM awooop_audit_log
     WHERE run_id = :run_id AND details ? 'retryable' AND (details->>'attempt')::int = :attempt
       AND from_status IN ('RUNNING', 'WAITING_TOOL'))

-- name: ReleasedBy :val
-- The holder of :attempt released :run_id (only ReleaseRun writes `released`; a claim's hand-back
-- of undelivered runs does not).
SELECT EXISTS (
    SELECT 1 FROM awooop_audit_log
     WHERE run_id = :run_id AND details ? 'released' AND (details->>'attempt')::int = :attempt
       AND from_status IN ('RUNNING', 'WAITING_TOOL'))

-- name: Wrote :val
-- The holder of :attempt wrote one of :audit_actions (WaitTool, ResumeTool, AcknowledgeCancel)
-- from a leased status.
SELECT EXISTS (
    SELECT 1 FROM awooop_audit_log
     WHERE run_id = :run_id AND action = ANY(:audit_actions::text[]) AND (details->>'attempt')::int = :attempt
       AND from_status IN ('RUNNING', 'WAITING_TOOL'))

-- name: CancelledBy :val
-- CancelRun is no lease's write: its repeat is recognised by its actor. :actor cancelled the run,
-- or asked its worker to (which then did): :audit_actions, the audit actions of CancelRun's outcomes.
SELECT EXISTS (
    SELECT 1 FROM awooop_audit_log
     WHERE run_id = :run_id AND actor = :actor AND action = ANY(:audit_actions::text[]))
