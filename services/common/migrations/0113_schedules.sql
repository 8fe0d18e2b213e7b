-- Schedules (docs/flow-control.md): a cron expression in a time zone creates one run per tick.
-- A tick is an event (channel 'api', provider_event_id 'schedule:<name>:<tick>'), so the event
-- dedupe makes it one run however many scheduler replicas fire it.
CREATE TABLE awooop_schedule (
    project_id   VARCHAR(64)  NOT NULL,
    name         VARCHAR(128) NOT NULL,
    cron         VARCHAR(256) NOT NULL,
    time_zone    VARCHAR(64)  NOT NULL DEFAULT 'UTC',
    input        JSONB        NOT NULL DEFAULT '{}',
    next_tick    TIMESTAMPTZ  NOT NULL,
    created_by   VARCHAR(160),
    created_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, name)
);
CREATE INDEX awooop_schedule_due_idx ON awooop_schedule (next_tick);
