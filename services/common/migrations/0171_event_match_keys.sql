-- Channel events satisfy event waits (issue 27; the vocabulary: docs/worker-sdk.md "Event
-- matches", the SDK's awooop/worker/event_matches.py). An event's match key, per channel, from
-- the run it created (its input is the event's payload):
--   api          the payload's "correlation_key"
--   telegram     the chat id of a message (message.chat.id): a reply in the same chat
--   alertmanager md5 hex of the groupKey of a resolve (status "resolved"): a fixed length for a
--                key of any length (a digest for matching, not a secret); firing events have none
--   gitea, line  none
-- The event matcher (MatchEventWaits) compares it with an open event wait's match_key.
CREATE FUNCTION awooop_event_key(p_channel TEXT, p_input JSONB) RETURNS TEXT
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE p_channel
        WHEN 'api' THEN p_input ->> 'correlation_key'
        WHEN 'telegram' THEN CASE WHEN jsonb_typeof(p_input -> 'message' -> 'chat' -> 'id') = 'number'
                                  THEN p_input -> 'message' -> 'chat' ->> 'id' END
        WHEN 'alertmanager' THEN CASE WHEN p_input ->> 'status' = 'resolved'
                                           AND jsonb_typeof(p_input -> 'groupKey') = 'string'
                                      THEN md5(p_input ->> 'groupKey') END
    END
$$;

-- The matcher's probe: events that carry a match key (others, such as firing alerts, pay nothing).
-- Replaces 0160's index of API correlation keys, which this one covers.
CREATE INDEX awooop_run_event_key_idx ON awooop_run_state
    (project_id, channel_type, awooop_event_key(channel_type, input), created_at)
    WHERE awooop_event_key(channel_type, input) IS NOT NULL;
DROP INDEX awooop_run_correlation_idx;
