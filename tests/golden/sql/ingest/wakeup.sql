-- name: NotifyProjects
-- params: channel, projects
-- Wake the scheduler's waiting claimers: one NOTIFY on the run-ready channel per project that got
-- claimable runs (sent after the runs' commit; Postgres folds identical ones of a transaction).
SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p
