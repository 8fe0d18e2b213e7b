-- Debounce and batch at ingest (issue 46, docs/flow-control.md#debounce-and-batch): a burst of
-- channel events of one key becomes one run, started once the key has been quiet for a window.
--
-- awooop_debounce_rule: per (project, channel), the key expression (a dotted path into the
-- event's input, services/common/debounce_key.py), the quiet window, the longest wait from the
-- batch's first event, and the mode ('all': the run's input carries every event; 'last': the
-- latest only). Set, listed and deleted by the scheduler's flow RPCs; ingest reads it.
CREATE TABLE awooop_debounce_rule (
    project_id     VARCHAR(64)  NOT NULL,
    channel_type   VARCHAR(32)  NOT NULL,
    key_expression VARCHAR(256) NOT NULL,
    window_secs    DOUBLE PRECISION NOT NULL CHECK (window_secs > 0 AND window_secs <= 86400),
    max_wait_secs  DOUBLE PRECISION NOT NULL CHECK (max_wait_secs >= window_secs AND max_wait_secs <= 86400),
    mode           VARCHAR(8)   NOT NULL CHECK (mode IN ('all', 'last')),
    updated_by     VARCHAR(160),
    updated_at     TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, channel_type)
);

-- awooop_debounce_window: per (project, channel, key value) the batch run last opened for the key
-- and when. Its row lock is what serializes the events of one key (ingest's debounce.sql locks it
-- first), so two events arriving together never open two batches; the batch itself is the run
-- (PENDING, wait_reason 'debounce', not_before the window's end): it is open while it is still
-- that and its not_before is ahead. A row outlives its batch and is reused by the key's next one;
-- retention prunes rows whose batch opened longer ago than the dedupe retention (retention.sql).
CREATE TABLE awooop_debounce_window (
    project_id    VARCHAR(64)  NOT NULL,
    channel_type  VARCHAR(32)  NOT NULL,
    debounce_key  VARCHAR(256) NOT NULL,
    run_id        UUID,
    opened_at     TIMESTAMPTZ,
    PRIMARY KEY (project_id, channel_type, debounce_key)
);
CREATE INDEX awooop_debounce_window_opened_idx ON awooop_debounce_window (opened_at);
