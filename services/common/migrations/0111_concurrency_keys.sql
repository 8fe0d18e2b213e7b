-- Concurrency keys (docs/flow-control.md): a run may carry one key; a project may limit how many
-- of its runs with that key hold a lease at once.

ALTER TABLE awooop_run_state ADD COLUMN concurrency_key VARCHAR(128);

-- running: leased runs with the key, kept by the claim (which adds what it grants) and by the
-- trigger below (which takes one off when such a run leaves its lease). granted: what the last
-- claim statement granted (read back by that statement's RETURNING).
CREATE TABLE awooop_concurrency_limit (
    project_id    VARCHAR(64)  NOT NULL,
    key           VARCHAR(128) NOT NULL,
    max_running   INT          NOT NULL CHECK (max_running BETWEEN 1 AND 100000),
    running       INT          NOT NULL DEFAULT 0 CHECK (running >= 0),
    granted       INT          NOT NULL DEFAULT 0,
    updated_by    VARCHAR(160),
    updated_at    TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, key)
);

-- A run the claim found behind a full key waits parked: still PENDING/RESUMED, not_before
-- 'infinity' (so it sorts after every ready run in awooop_run_claim_idx and the claim's scan
-- never reaches it), wait_reason 'key_busy'. This index finds the parked runs of a key.
CREATE INDEX awooop_run_parked_idx ON awooop_run_state (project_id, concurrency_key, priority DESC, created_at)
    WHERE status IN ('PENDING', 'RESUMED') AND not_before = 'infinity';

-- When a run with a limited key leaves its lease (completed, failed, released, reaped, cancelled,
-- waiting for approval): one slot is given back and as many parked runs of the key as there are
-- free slots become claimable, with a wake-up NOTIFY, in the same transaction as the change.
-- The key row's lock orders this against a claim that is parking runs of the same key (the claim
-- always updates the key row), so a run is never left parked behind a free slot.
CREATE FUNCTION awooop_release_concurrency_slot() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    free INT;
    woken INT;
BEGIN
    UPDATE awooop_concurrency_limit
       SET running = greatest(running - 1, 0)
     WHERE project_id = NEW.project_id AND key = NEW.concurrency_key
    RETURNING max_running - running INTO free;
    IF free IS NULL OR free <= 0 THEN
        RETURN NULL;
    END IF;
    WITH w AS (
        UPDATE awooop_run_state r
           SET not_before = NULL, wait_reason = NULL
         WHERE r.run_id IN (SELECT p.run_id FROM awooop_run_state p
                             WHERE p.project_id = NEW.project_id AND p.concurrency_key = NEW.concurrency_key
                               AND p.status IN ('PENDING', 'RESUMED') AND p.not_before = 'infinity'
                             ORDER BY p.priority DESC, p.created_at
                             LIMIT free
                               FOR UPDATE SKIP LOCKED)
        RETURNING r.run_id
    )
    SELECT count(*) INTO woken FROM w;
    IF woken > 0 THEN
        PERFORM pg_notify('awooop_run_ready', NEW.project_id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER awooop_run_release_concurrency_slot
    AFTER UPDATE OF status ON awooop_run_state
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL
          AND OLD.status IN ('RUNNING', 'WAITING_TOOL')
          AND NEW.status NOT IN ('RUNNING', 'WAITING_TOOL'))
    EXECUTE FUNCTION awooop_release_concurrency_slot();
