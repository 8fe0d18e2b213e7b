-- name: NotifyProjects :exec
-- Wake the scheduler's waiting claimers: one NOTIFY on the run-ready channel per project that got
-- claimable runs (sent after the runs' commit; Postgres folds identical ones of a transaction).
SELECT pg_notify(:channel, p) FROM unnest(:projects::text[]) AS p
