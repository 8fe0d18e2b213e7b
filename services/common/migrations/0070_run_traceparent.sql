-- OpenTelemetry: the W3C traceparent of the span that created the run (IngestEvent or CreateRun),
-- so the claim, the worker's steps and the saga's compensation continue the same trace.
-- NULL when tracing was off. Adding a nullable column without a default rewrites nothing.
ALTER TABLE awooop_run_state ADD COLUMN traceparent VARCHAR(55);
