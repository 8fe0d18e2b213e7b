-- EmitEvent stored a progress event's data as a JSON string holding the object's text (the
-- statement's jsonb parameter went through the pool's codec, which encoded the text once more):
-- `data ->> 'key'` was NULL for every progress row, and the run's byte bound counted the escapes.
-- WatchRun and the SSE stream parsed the string back, so readers of the API saw objects. The
-- statement now hands Postgres the text to parse (scheduler/run_events.sql EmitRunEvent); the
-- rows written before are parsed here. A progress event's data is always an object (a Struct),
-- so a string there is always this encoding.
UPDATE awooop_run_event
   SET data = (data #>> '{}')::jsonb
 WHERE source = 'progress' AND jsonb_typeof(data) = 'string';
