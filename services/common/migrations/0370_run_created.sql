-- The indexes that find a run by what never changes move off the run row (issue 43).
--
-- A run row is updated about three times (claim, heartbeat, completion), and an update that is
-- not HOT (every status change: the dispatch indexes' predicates name the status) adds an entry
-- to every index of the row, changed or not. Two of them index only what a run is created with:
-- awooop_run_list_idx (project, creation time, run id: ListRuns) and awooop_run_event_key_idx
-- (the event matcher's key, migration 0171). Together they took 3.3 entries each per run, 645 of
-- its 5,100 bytes of WAL.
--
-- awooop_run_created holds those facts once per run, written by the statement that creates the
-- run (a statement trigger: every writer of runs, the services' and an operator's) and deleted
-- with it (the same for deletes). Its two indexes take one entry each per run. No statement of the
-- services updates a run's project_id, created_at, channel_type or input; a row trigger on those
-- columns alone carries an operator's (or a test's) update over, and fires for nothing else.

CREATE TABLE awooop_run_created (
    project_id   VARCHAR(64)  NOT NULL,
    created_at   TIMESTAMPTZ  NOT NULL,
    run_id       UUID         NOT NULL,
    channel_type VARCHAR(32)  NOT NULL,
    match_key    TEXT         -- awooop_event_key(channel_type, input); NULL: the event has none
);

INSERT INTO awooop_run_created (project_id, created_at, run_id, channel_type, match_key)
SELECT project_id, created_at, run_id, channel_type, awooop_event_key(channel_type, input)
  FROM awooop_run_state;

-- ListRuns' project arm and ListProjects; the delete and update triggers' probe. Unique (a run id
-- is), so it is the table's replica identity: every other table has a primary key, and logical
-- replication of a table without one refuses its deletes (retention's)
CREATE UNIQUE INDEX awooop_run_created_list_idx ON awooop_run_created (project_id, created_at DESC, run_id);
ALTER TABLE awooop_run_created REPLICA IDENTITY USING INDEX awooop_run_created_list_idx;
-- the event matcher's probe (0171's index, on the fact instead of the run row)
CREATE INDEX awooop_run_created_match_idx ON awooop_run_created (project_id, channel_type, match_key, created_at)
    WHERE match_key IS NOT NULL;

CREATE FUNCTION awooop_run_created() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO awooop_run_created (project_id, created_at, run_id, channel_type, match_key)
    SELECT n.project_id, n.created_at, n.run_id, n.channel_type, awooop_event_key(n.channel_type, n.input)
      FROM created_runs n;
    RETURN NULL;
END $$;

CREATE TRIGGER awooop_run_created AFTER INSERT ON awooop_run_state
    REFERENCING NEW TABLE AS created_runs
    FOR EACH STATEMENT EXECUTE FUNCTION awooop_run_created();

CREATE FUNCTION awooop_run_deleted() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM awooop_run_created c
     USING deleted_runs d
     WHERE c.project_id = d.project_id AND c.created_at = d.created_at AND c.run_id = d.run_id;
    RETURN NULL;
END $$;

CREATE TRIGGER awooop_run_deleted AFTER DELETE ON awooop_run_state
    REFERENCING OLD TABLE AS deleted_runs
    FOR EACH STATEMENT EXECUTE FUNCTION awooop_run_deleted();

CREATE FUNCTION awooop_run_facts_changed() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE awooop_run_created
       SET project_id = NEW.project_id, created_at = NEW.created_at, channel_type = NEW.channel_type,
           match_key = awooop_event_key(NEW.channel_type, NEW.input)
     WHERE project_id = OLD.project_id AND created_at = OLD.created_at AND run_id = OLD.run_id;
    RETURN NULL;
END $$;

CREATE TRIGGER awooop_run_facts_changed AFTER UPDATE OF project_id, created_at, channel_type, input
    ON awooop_run_state
    FOR EACH ROW
    WHEN (OLD.project_id IS DISTINCT FROM NEW.project_id OR OLD.created_at IS DISTINCT FROM NEW.created_at
          OR OLD.channel_type IS DISTINCT FROM NEW.channel_type OR OLD.input IS DISTINCT FROM NEW.input)
    EXECUTE FUNCTION awooop_run_facts_changed();

DROP INDEX awooop_run_list_idx;
DROP INDEX awooop_run_event_key_idx;

-- A project's finished runs, which CountRuns (include_finished) counted and RedriveRuns searched
-- through the list index: one entry when a run ends, where the list index took one per update.
-- The counts read it alone (an index-only scan), the redrive a status's runs in updated_at order.
CREATE INDEX awooop_run_project_finished_idx ON awooop_run_state (project_id, status, updated_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');
