-- The tool role (issue 27, docs/worker-sdk.md "Parked tool calls"): a key for a tool or external
-- system that completes durable waits (CompleteWait) in its project and may do nothing else.
ALTER TABLE awooop_project_member DROP CONSTRAINT awooop_project_member_role_check;
ALTER TABLE awooop_project_member ADD CONSTRAINT awooop_project_member_role_check
    CHECK (role IN ('ingest', 'worker', 'approver', 'admin', 'tool'));
