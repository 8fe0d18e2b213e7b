-- Rate keys (docs/flow-control.md): a key may also (or only) limit how many runs with it start
-- per period. Starts are counted in fixed windows: the first claim after a window ended opens the
-- next one. max_running NULL: no concurrency limit on the key.
ALTER TABLE awooop_concurrency_limit
    ALTER COLUMN max_running DROP NOT NULL,
    ADD COLUMN max_starts    INT      CHECK (max_starts BETWEEN 1 AND 1000000),
    ADD COLUMN rate_period   INTERVAL CHECK (rate_period > interval '0'),
    ADD COLUMN window_start  TIMESTAMPTZ,
    ADD COLUMN window_starts INT      NOT NULL DEFAULT 0,
    ADD CONSTRAINT awooop_concurrency_limit_some CHECK (max_running IS NOT NULL OR max_starts IS NOT NULL),
    ADD CONSTRAINT awooop_concurrency_limit_rate CHECK ((max_starts IS NULL) = (rate_period IS NULL));
