-- The audit log's (project_id, audit_id) index served no statement (issue 43): every read of the
-- log is a run's (awooop_audit_log_run_idx: GetRun's history, the replays' checks, retention),
-- while each audit row, three or more per run, paid an entry in it. An operator's query of a
-- project's whole log now reads the table.
DROP INDEX awooop_audit_log_project_idx;
