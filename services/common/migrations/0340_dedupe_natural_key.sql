-- The channel dedupe row is keyed by what it dedupes (issue 43). Its surrogate key (dedupe_id, a
-- random UUID) was read only by the prune, which can name the row by the natural key as well,
-- while every ingested event paid a second unique index entry for it. The primary key is now
-- (project_id, channel_type, provider_event_id): the unique constraint it replaces, one index
-- instead of two.
ALTER TABLE awooop_channel_event_dedupe
    DROP CONSTRAINT awooop_channel_event_dedupe_pkey,
    DROP CONSTRAINT awooop_channel_event_dedupe_project_id_channel_type_provide_key,
    DROP COLUMN dedupe_id,
    ADD CONSTRAINT awooop_channel_event_dedupe_pkey PRIMARY KEY (project_id, channel_type, provider_event_id);
