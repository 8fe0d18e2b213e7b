-- Room on each page of the run table for the new versions of its rows (issue 43). A run is
-- updated three times or more (claim, heartbeats, completion); with full pages every new version
-- went to another page, so each update logged the whole row and, for a heartbeat, an entry in
-- every index. With free space on the page a heartbeat is a HOT update (it changes no indexed
-- column), and every update logs only the bytes that changed. Pages written from now on keep
-- 30 % free; existing pages keep their layout until rewritten.
ALTER TABLE awooop_run_state SET (fillfactor = 70);
