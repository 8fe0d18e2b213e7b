-- A callback URL handed out stays valid when the run is retried (issue 41, item 2; docs/
-- architecture.md "Durable waits").
--
-- A token wait's callback token is returned once and stored only as its sha256. A later
-- CreateWait of the same wait (the run retried after a crash before it parked) must issue a new
-- token, since the first one's plaintext may have been lost with the crashed attempt. Until now the
-- new token replaced the old one. But a handler that handed the first URL out from a journaled step
-- (the pattern docs/worker-sdk.md recommends) does not hand it out again: the retry skips that
-- step, the URL the outside world holds answered 404, and the run waited until E-WAIT-TIMEOUT.
--
-- Now every token issued for a wait is kept here, and any of them completes it (the first outcome
-- wins, as before, awooop_end_wait): a URL outlives the attempt that issued it. Tokens go with their
-- wait (ON DELETE CASCADE: run retention). A token is still 32 random bytes and single use, in the
-- sense that the wait it names ends once.
CREATE TABLE awooop_wait_token (
    token_hash  BYTEA       PRIMARY KEY,  -- the callback URL's lookup
    wait_id     UUID        NOT NULL REFERENCES awooop_wait (wait_id) ON DELETE CASCADE,
    issued_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- the cascade's lookup when a run's waits are deleted
CREATE INDEX awooop_wait_token_wait_idx ON awooop_wait_token (wait_id);

INSERT INTO awooop_wait_token (token_hash, wait_id, issued_at)
SELECT token_hash, wait_id, created_at FROM awooop_wait WHERE token_hash IS NOT NULL;

-- the one token a wait had; its unique index and its CHECK go with it
ALTER TABLE awooop_wait DROP COLUMN token_hash;
