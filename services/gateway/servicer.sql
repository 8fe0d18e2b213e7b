-- name: LogRequest :val
-- not null: request_id
-- Every ExecuteTool call, before it runs (its outcome comes later).
INSERT INTO awooop_refgw_request (project_id, idempotency_key, tool_id) VALUES (:project_id, :idempotency_key, :tool_id)
RETURNING request_id

-- name: RecordOutcome :exec
-- A logged call's end: executed, replayed or failed (with its error).
UPDATE awooop_refgw_request SET outcome = :outcome, error = :error, finished_at = now()
 WHERE request_id = :request_id

-- name: LockKey :exec
-- Serializes the calls of one "<project>/<idempotency key>" until the transaction ends.
SELECT pg_advisory_xact_lock(hashtextextended(:lock_name, 0))

-- name: RecordedCall :one
-- The recorded success of a key, if any (its replay).
SELECT tool_id, result FROM awooop_refgw_call WHERE project_id = :project_id AND idempotency_key = :idempotency_key

-- name: CountReplay :exec
UPDATE awooop_refgw_call SET replays = replays + 1
 WHERE project_id = :project_id AND idempotency_key = :idempotency_key

-- name: RecordCall :exec
-- A success, recorded under its key in the transaction that ran the tool.
INSERT INTO awooop_refgw_call (project_id, idempotency_key, tool_id, params, result, run_id, reason)
VALUES (:project_id, :idempotency_key, :tool_id, :params, :result, :run_id, :reason)

-- name: TakeFault :one
-- Consumes one failure of an injected fault of the tool: the project's own before a '*' one; a
-- NULL remaining never runs out.
UPDATE awooop_refgw_fault SET remaining = remaining - 1
 WHERE (project_id, tool_id) = (
        SELECT project_id, tool_id FROM awooop_refgw_fault
         WHERE tool_id = :tool_id AND project_id IN (:project_id, '*') AND (remaining IS NULL OR remaining > 0)
         ORDER BY project_id = '*' LIMIT 1)
RETURNING code, message
