-- Which journal steps a compensation undoes, as one SQL function every statement calls: a
-- completed tool call with an undo command. `compensating` counts too: its undo was started and
-- its outcome is not recorded yet, so the driver calls the gateway again with the same key (which
-- replays). The saga's statements (services/saga/driver.sql, operator_actions.sql) use it; it is
-- written in SQL (immutable, no SET clause) so that the planner inlines it into the calling
-- statement: the plans are those of the condition written out.
CREATE FUNCTION awooop_step_compensatable(step_type TEXT, compensation_cmd JSONB, status TEXT)
RETURNS BOOLEAN LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT step_type = 'tool_call' AND compensation_cmd IS NOT NULL AND compensation_cmd <> 'null'::jsonb
       AND status IN ('completed', 'compensating')
$$;
