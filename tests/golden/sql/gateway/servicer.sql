-- name: LogRequest
-- params: project_id, idempotency_key, tool_id
-- Every ExecuteTool call, before it runs (its outcome comes later).
INSERT INTO awooop_refgw_request (project_id, idempotency_key, tool_id) VALUES ($1, $2, $3)
RETURNING request_id

-- name: RecordOutcome
-- params: outcome, error, request_id
-- A logged call's end: executed, replayed or failed (with its error).
UPDATE awooop_refgw_request SET outcome = $1, error = $2, finished_at = now()
 WHERE request_id = $3

-- name: LockKey
-- params: lock_name
-- Serializes the calls of one "<project>/<idempotency key>" until the transaction ends.
SELECT pg_advisory_xact_lock(hashtextextended($1, 0))

-- name: RecordedCall
-- params: project_id, idempotency_key
-- The recorded success of a key, if any (its replay).
SELECT tool_id, result FROM awooop_refgw_call WHERE project_id = $1 AND idempotency_key = $2

-- name: CountReplay
-- params: project_id, idempotency_key
UPDATE awooop_refgw_call SET replays = replays + 1
 WHERE project_id = $1 AND idempotency_key = $2

-- name: RecordCall
-- params: project_id, idempotency_key, tool_id, params, result, run_id, reason
-- A success, recorded under its key in the transaction that ran the tool.
INSERT INTO awooop_refgw_call (project_id, idempotency_key, tool_id, params, result, run_id, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7)

-- name: TakeFault
-- params: tool_id, project_id
-- Consumes one failure of an injected fault of the tool: the project's own before a '*' one; a
-- NULL remaining never runs out.
UPDATE awooop_refgw_fault SET remaining = remaining - 1
 WHERE (project_id, tool_id) = (
        SELECT project_id, tool_id FROM awooop_refgw_fault
         WHERE tool_id = $1 AND project_id IN ($2, '*') AND (remaining IS NULL OR remaining > 0)
         ORDER BY project_id = '*' LIMIT 1)
RETURNING code, message
