-- The claim (ClaimRuns), the completions (CompleteRuns) and the claim that carries completions
-- (ClaimRuns.complete) are one statement, ClaimRuns: services/scheduler/claiming.py and
-- batch_complete.py run it.
--
-- Variants, by one rule (services/common/sql.py): two integer slots, {{max_runs}}, the claim's
-- size, and {{count}}, the number of projects. Nothing else varies: a claim without a claim id
-- runs the same statement with :claim_id, :principal and :sorted_projects NULL (its `prior` finds
-- nothing, its `recorded` inserts nothing), a call without completions with empty item arrays,
-- and CompleteRuns with no projects and max_runs 0.
--
-- Why the numbers are written into the text: with max_runs written, the plan Postgres builds
-- without the parameters' values is the one it builds with them, so it keeps that generic plan
-- and stops planning the statement on every call (with a `LIMIT $n` it cannot estimate the
-- claim's size, prefers a plan per call, and the planning costs about as much as executing it).
-- For the same reason the projects' unnest carries `LIMIT {{count}}` (it never cuts: the array
-- holds exactly count): a generic plan otherwise estimates 10 projects, costs their lateral scans
-- against the custom plan's 1 to 3, and on some statistics Postgres then plans the claim on every
-- call (measured: 1.0 against 0.55 ms a claim, bench flow).
--
-- Every statement here that reads listed runs of awooop_run_state also names them as
-- `run_id = ANY(<the ids>)`, next to its join: an index condition of the scan itself, so a
-- generic plan made while the table was empty or small (services/common/planner.py) probes the
-- primary key per run instead of reading the whole index to join it (tests/test_hot_plans.py).

-- name: ClaimRuns :many
-- slots: max_runs=10, count=3
-- ClaimRuns (carrying completions or not) and CompleteRuns, in one statement and one commit: the
-- items (ClaimRunsRequest.complete, CompleteRuns' runs; empty arrays when the call has none) are
-- completed first, then up to max_runs runs of `count` distinct projects (:projects) are
-- claimed for :worker_id, leases of :lease_secs seconds. CompleteRuns alone is this statement
-- with no projects and max_runs 0 (batch_complete.COMPLETE_MANY): nothing is scanned for a claim.
-- The completions never touch a claimed row: `upd` changes rows that are RUNNING in the
-- statement's snapshot, the claim rows that are PENDING/RESUMED in it.
--
-- Rows: one per item, in item order: the locked row's state (cur_*; NULL when the run does not
-- exist) and, when this item completed the run, the changed row (run_id not NULL); then the
-- claimed runs (item NULL: the run columns with the run's place in its tree, from_status,
-- claim_wait: seconds since the run became claimable), higher priority first, then oldest; no
-- run claimed: one row with NULL run columns.
-- Every row carries `parked` (runs this statement parked behind full keys) and `recorded` (an
-- answer was recorded for the claim id before: nothing was claimed, the call replays it).
--
-- The completions. :run_ids, :attempts, :outputs (JSON text) in request order; :allowed the
-- statuses CompleteRun may start from (runstate.TRANSITIONS), :worker_projects the projects where
-- the caller is a worker (NULL: all). Per item the rules are CompleteRun's (fenced_writes.sql
-- CompleteRun): the same SET list, fence and audit row. cur locks the rows in run_id order, so
-- overlapping batches wait for each other instead of deadlocking. win: a run named twice is
-- completed at most once, by the first item whose token names the current attempt. held_keys:
-- the concurrency keys of the runs it completes and of those it picks, locked in key order in one
-- pass before `upd` starts; the triggers that give the completed runs' slots back then find them
-- held. Taken run by run, in the order the rows happen to be updated, they could close a cycle (a
-- deadlock) with a claim or a batch sharing the keys. RECURSIVE (nothing recurses) lets held_keys
-- name `picked`, which comes later in the list. The status test is wrapped in `IS TRUE` (status is
-- NOT NULL: same meaning) so the planner cannot match it to the predicate of
-- awooop_run_leased_idx: believing that partial index nearly empty, it would scan all of it and
-- compare every leased run with every item (leases held x batch) instead of one primary-key probe
-- per item.
--
-- prior: the answer recorded for (principal, worker id, claim id), one primary-key probe
-- (services/scheduler/claim_answers.py); when there is one, the scans never start (a one-time
-- filter). recorded: the claimed runs as (run_id, attempt) pairs and the claim's parameters,
-- inserted only when the claim took runs and carries a claim id (an empty claim records nothing,
-- so a long-poll's next round or a retry claims as usual).
--
-- picked: per project, the ordered scan of the claim index, LIMIT max_runs, FOR UPDATE SKIP LOCKED
-- (its scan starts after `cur` locked the items: a one-time filter). A queued run is claimable
-- past its not_before (a retry backoff or a requested delay) with attempts left (ReleaseRun and
-- approval hand-backs are not spent attempts: attempt_count - released_count); higher priority
-- first, then the earliest due (not_before, else creation). awooop_run_claim_idx is (project_id,
-- priority DESC, due), so each scan reads the runs in that order and stops after max_runs ready
-- ones; equality on project_id keeps the index order, so the cost does not grow with the backlog
-- (`project_id = ANY(...)` would sort every pending run of the projects on each claim). When fewer
-- than max_runs are ready the scan goes on into the runs not due yet (parked, delayed): the due
-- bound is the index's own expression, so they are passed over inside the index instead of read
-- from the heap one by one for not_before (a claim of a project with 10,000 parked runs and none
-- ready read all 10,000). The bound is a second later than now(), so it never leaves out a run the
-- exact filter before it takes (StoreEvents spaces a batch's created_at by a microsecond an event,
-- from its transaction's start); a run created more than a second ahead of a claim's clock (the
-- clock stepped back) waits for a claim that comes after its creation time. A paused
-- project is left out of the projects scanned (PauseProject). Then max_runs of those, interleaved
-- by the projects' weights. Fairness: the k-th run of a project sorts at (k - 1 + e) / weight, e
-- drawn per project and claim from Exp(1): the first run goes to a project with probability
-- weight / total weight, and a claim of several runs interleaves the projects by weight, so a
-- backlog in one project never holds back another's runs. Rows locked by the scans but not kept
-- are released when the statement's transaction ends.
--
-- Versions (migration 0390; docs/versioning.md): :build_id is the claiming worker's build ('': it
-- declared none; not NULL, which a custom plan would fold into the conditions below and, costed
-- lower than the generic plan, make Postgres plan the claim on every call). A run whose journal holds steps (written by its build's code) goes only to
-- its own build while it is pinned, and only to the project's newest build that is not draining
-- (the latest first seen: `newest`; none registered: its own) when it auto-upgrades (its own
-- auto_upgrade, else its project's versioning). A run with no build yet, or with an empty
-- journal, goes to any build. A draining build (`draining`, DrainBuild) takes only the runs that need it: on it, with
-- steps journaled. The claim
-- records the claimer's build on the run (build_id), so a run that journals steps is on the build
-- whose code wrote them.
--
-- Labels (migration 0400; docs/flow-control.md, "Worker labels"): :labels is the claiming worker's
-- labels as a JSON object ('{}': none; never NULL, for build_id's reason). A run that requires
-- labels goes only to a worker whose labels contain them. A run that prefers labels goes, for
-- :prefer_secs after it became ready, only to a worker that has them, unless no such worker is
-- live (seen within :live_secs, awooop_worker); a run resumed after a wait or an approval goes,
-- for its project's sticky_seconds, only to the worker that held it (sticky_worker, written by the
-- parking only in a project with sticky resume), while that worker is live;
-- a worker of another build than the sticky one's is not held back (the run may be moving to a
-- new build, where the worker it sticks to cannot take it). The claim clears sticky_worker. Runs that require labels no live worker has are parked by the
-- label sweep (workers.sql SweepLabels: not_before 'infinity', wait_reason 'labels'), so a claim
-- does not pass over them one by one.
--
-- blocked / parked / go: concurrency keys (docs/flow-control.md). A picked run is granted only
-- when every one of its limited keys has a free slot and starts left in its rate window; then it
-- takes one of each. awooop_grant_keys (migration 0120) locks the picked runs' limited keys in key
-- order, decides them in claim order, writes the keys' counts and returns the runs it refused,
-- each with the key it waits on; a claim whose picked runs carry no keys does not call it. A
-- refused run is parked: behind a busy key (not_before 'infinity', wait_reason key_busy: after
-- every ready run in the claim index, past the due bound of later claims' scans, until the trigger of
-- migration 0120 wakes it when the key frees a slot) or until the key's rate window ends
-- (rate_limited). The key rows' locks order this claim against a release of the same keys, so a
-- run is never parked behind a key that has room.
WITH RECURSIVE items AS (
    SELECT t.item, t.run_id, t.attempt, t.output::jsonb AS output
      FROM unnest(:run_ids::uuid[], :attempts::int[], :outputs::text[]) WITH ORDINALITY AS t(run_id, attempt, output, item)
),
cur AS (
    SELECT * FROM awooop_run_cur WHERE cur_run_id = ANY(:run_ids::uuid[]) ORDER BY cur_run_id FOR UPDATE
),
held_keys AS MATERIALIZED (
    SELECT l.project_id, l.key FROM awooop_concurrency_limit l
     WHERE (l.project_id, l.key) IN (
             SELECT c.cur_project, k FROM cur c CROSS JOIN LATERAL unnest(c.cur_keys) AS k
             UNION ALL SELECT p.project_id, k FROM picked p CROSS JOIN LATERAL unnest(p.ckeys) AS k)
     ORDER BY l.project_id, l.key
       FOR UPDATE
),
win AS (
    SELECT DISTINCT ON (it.run_id) it.item, it.run_id, it.attempt, it.output, cur.cur_status, cur.cur_worker
      FROM items it JOIN cur ON cur.cur_run_id = it.run_id
     WHERE it.attempt = cur.cur_attempt
     ORDER BY it.run_id, it.item
),
upd AS (
    UPDATE awooop_run_state r
       SET status = 'COMPLETED', output = w.output, lease_until = NULL, worker_id = NULL,
           failure_reason = NULL, error_code = NULL, not_before = NULL, saga_status = 'not_needed', updated_at = now()
      FROM win w
     WHERE r.run_id = ANY(:run_ids::uuid[])
       AND r.run_id = w.run_id
       AND awooop_fence_holds(r.attempt_count, r.status, r.project_id, w.attempt, :allowed, :worker_projects)
       AND (SELECT count(*) FROM held_keys) >= 0
 RETURNING r.*,
           w.cur_status AS from_status, w.item AS upd_item, w.cur_worker AS prev_worker
),
prior AS MATERIALIZED (
    SELECT 1 FROM awooop_claim_answer
     WHERE principal = :principal::text AND worker_id = :worker_id AND claim_id = :claim_id::text
),
picked AS (
    SELECT run_id, from_status, project_id, ckeys, priority, due, ready_since
      FROM (SELECT c.run_id, c.from_status, p.project_id, c.ckeys, c.priority, c.due, c.ready_since, p.e, p.w,
                   row_number() OVER (PARTITION BY p.project_id ORDER BY c.priority DESC, c.due) AS k
              FROM (SELECT u.project_id, -ln(1.0 - random()) AS e, COALESCE(f.weight, 1) AS w,
                           f.versioning IS NOT DISTINCT FROM 'auto_upgrade' AS auto_upgrade,
                           COALESCE(f.sticky_seconds, 0) AS sticky_secs,
                           b.drained_at IS NOT NULL AS draining,
                           (SELECT n.build_id FROM awooop_worker_build n
                             WHERE n.project_id = u.project_id AND n.drained_at IS NULL
                             ORDER BY n.first_seen_at DESC, n.build_id LIMIT 1) AS newest
                      FROM (SELECT * FROM unnest(:projects::text[]) LIMIT {{count}}) AS u(project_id)
                      LEFT JOIN awooop_project_flow f ON f.project_id = u.project_id
                      LEFT JOIN awooop_worker_build b ON b.project_id = u.project_id AND b.build_id = :build_id::text
                     WHERE f.paused IS NOT TRUE) p
             CROSS JOIN LATERAL (
                    SELECT run_id, status AS from_status, concurrency_keys AS ckeys, priority,
                           COALESCE(not_before, created_at) AS due, GREATEST(updated_at, not_before) AS ready_since
                      FROM awooop_run_state
                     WHERE project_id = p.project_id
                       AND status IN ('PENDING', 'RESUMED')
                       AND (not_before IS NULL OR not_before <= now())
                       AND COALESCE(not_before, created_at) <= now() + interval '1 second'
                       AND attempt_count - released_count < max_attempts
                       AND (build_id IS NULL
                            OR CASE WHEN COALESCE(awooop_run_state.auto_upgrade, p.auto_upgrade)
                                    THEN COALESCE(p.newest, build_id) = :build_id::text
                                    ELSE build_id = :build_id::text END
                            OR NOT EXISTS (SELECT 1 FROM awooop_saga_step s WHERE s.run_id = awooop_run_state.run_id))
                       AND (NOT p.draining
                            OR (build_id = :build_id::text
                                AND EXISTS (SELECT 1 FROM awooop_saga_step s WHERE s.run_id = awooop_run_state.run_id)))
                       AND (required_labels IS NULL OR :labels::text::jsonb @> required_labels)
                       AND (preferred_labels IS NULL OR :labels::text::jsonb @> preferred_labels
                            OR GREATEST(updated_at, not_before) < now() - make_interval(secs => :prefer_secs)
                            OR NOT EXISTS (SELECT 1 FROM awooop_worker w
                                            WHERE w.project_id = p.project_id AND w.labels @> preferred_labels
                                              AND w.last_seen_at > now() - make_interval(secs => :live_secs)))
                       AND (sticky_worker IS NULL OR sticky_worker = :worker_id
                            OR GREATEST(updated_at, not_before) < now() - make_interval(secs => p.sticky_secs)
                            OR NOT EXISTS (SELECT 1 FROM awooop_worker w
                                            WHERE w.project_id = p.project_id AND w.worker_id = sticky_worker
                                              AND w.build_id IS NOT DISTINCT FROM NULLIF(:build_id::text, '')
                                              AND w.last_seen_at > now() - make_interval(secs => :live_secs)))
                       AND (SELECT count(*) FROM cur) >= 0
                       AND NOT EXISTS (SELECT 1 FROM prior)
                     ORDER BY priority DESC, COALESCE(not_before, created_at)
                     LIMIT {{max_runs}}
                       FOR UPDATE SKIP LOCKED
                   ) c) t
     ORDER BY (t.k - 1 + t.e) / t.w
     LIMIT {{max_runs}}
),
blocked AS (
    SELECT b.b_run AS run_id, b.b_key AS key, b.b_until AS window_end
      FROM (SELECT array_agg(run_id ORDER BY priority DESC, due, run_id) AS runs,
                   array_agg(project_id ORDER BY priority DESC, due, run_id) AS projects,
                   array_agg(array_to_string(ckeys, ' ') ORDER BY priority DESC, due, run_id) AS keys
              FROM picked WHERE ckeys IS NOT NULL) a
     CROSS JOIN LATERAL awooop_grant_keys(a.runs, a.projects, a.keys) AS b
),
parked AS (
    UPDATE awooop_run_state r
       SET not_before = COALESCE(b.window_end, 'infinity'),
           wait_reason = CASE WHEN b.window_end IS NULL THEN 'key_busy' ELSE 'rate_limited' END,
           wait_key = b.key
      FROM blocked b
     WHERE r.run_id = ANY(ARRAY(SELECT run_id FROM blocked))
       AND r.run_id = b.run_id
 RETURNING r.run_id
),
go AS (
    SELECT p.run_id, p.from_status, p.ready_since FROM picked p
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.run_id = p.run_id)
),
claimed AS (
    UPDATE awooop_run_state r
       SET status = 'RUNNING',
           lease_until = now() + make_interval(secs => :lease_secs),
           heartbeat_at = now(),
           attempt_count = r.attempt_count + 1,
           worker_id = :worker_id,
           not_before = NULL,
           wait_reason = NULL,
           wait_key = NULL,
           updated_at = now(),
           build_id = COALESCE(NULLIF(:build_id::text, ''), r.build_id),
           sticky_worker = NULL
      FROM go p
     WHERE r.run_id = ANY(ARRAY(SELECT run_id FROM go))
       AND r.run_id = p.run_id
 -- upd's columns in upd's order (NULL where a claim has none), so the final UNION ALL's arms line up
 RETURNING r.*, p.from_status, NULL::bigint AS upd_item, NULL::text AS prev_worker, NULL::text AS comp_trigger,
           EXTRACT(EPOCH FROM clock_timestamp() - p.ready_since)::float8 AS claim_wait
),
-- the completions' history rows, then the claims' (outcome's join runs it)
audited AS (
    SELECT awooop_record_history(ARRAY(
               SELECT ROW(project_id, run_id, :actor, 'COMPLETED', from_status, status, NULL,
                          jsonb_build_object('attempt', attempt_count, 'worker_id', prev_worker))::awooop_history_row
                 FROM upd
               UNION ALL
               SELECT ROW(project_id, run_id, :actor, 'CLAIMED', from_status, 'RUNNING', NULL,
                          jsonb_build_object('attempt', attempt_count, 'worker_id', worker_id,
                                             'lease_until', lease_until)
                          -- the build of this attempt (the first CLAIMED row's: the build that first ran it)
                          || CASE WHEN :build_id::text <> ''
                                  THEN jsonb_build_object('build_id', :build_id::text) ELSE '{}' END
                          )::awooop_history_row
                 FROM claimed)) AS recorded
),
recorded AS (
    INSERT INTO awooop_claim_answer (principal, worker_id, claim_id, project_ids, max_runs, lease_ttl, run_ids, attempts,
                         expires_at)
    SELECT :principal::text, :worker_id, :claim_id::text, :sorted_projects::text[], {{max_runs}}, :lease_secs,
           array_agg(run_id), array_agg(attempt_count), now() + make_interval(secs => :lease_secs)
      FROM claimed
    HAVING count(*) > 0 AND :claim_id::text IS NOT NULL
),
outcome AS (
    SELECT (SELECT count(*) FROM parked) AS parked, EXISTS (SELECT 1 FROM prior) AS recorded FROM audited
)
SELECT it.item, cur.*, upd.*, NULL::text AS comp_trigger, NULL::float8 AS claim_wait, o.parked, o.recorded
  FROM items it
 CROSS JOIN outcome o
  LEFT JOIN cur ON cur.cur_run_id = it.run_id
  LEFT JOIN upd ON upd.upd_item = it.item
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, claimed.*, o.parked, o.recorded
  FROM outcome o
  LEFT JOIN claimed ON true
 ORDER BY item, priority DESC, created_at

-- name: SecondsUntilReady :val
-- slots: count=1
-- When nothing is claimable: seconds until the earliest retry backoff, delay or rate-limit window
-- of :projects ends (a long-polling claim re-checks then); NULL when none is pending. Only run on
-- the empty path. Parked runs ('infinity') wait for a key or a wait, not a time. Per project, the
-- first entry of awooop_run_delayed_idx past now() (migration 0270), however many runs are queued.
-- {{count}} is the number of projects: with it in the text Postgres keeps one plan for the
-- statement instead of planning it on every call (an array parameter's length is unknown to a
-- generic plan, which then costs it as ten projects).
SELECT EXTRACT(EPOCH FROM min(d.due) - now())::float8
  FROM (SELECT * FROM unnest(:projects::text[]) LIMIT {{count}}) AS p(project_id)
 CROSS JOIN LATERAL (
        SELECT min(not_before) AS due
          FROM awooop_run_state
         WHERE project_id = p.project_id AND status IN ('PENDING', 'RESUMED')
           AND not_before > now() AND not_before < 'infinity') d

-- name: HandBackUndelivered :many
-- The hand-back (runstate Action.HAND_BACK; services/scheduler/hand_back.py decides when): runs a
-- claim took but did not deliver (left out of the answer, or their caller is gone) go back in one
-- statement, as a ReleaseRun would (released_count + 1: the attempt does not count), to the status
-- they were claimed from. :run_ids, :attempts, :from_statuses in the same order; :worker_id the
-- claim's worker; :reason says why (the audit reason). A run whose cancel was requested in between
-- is left to the reaper (which ends it as cancelled). The audit details carry no `released`: a
-- repeat of a ReleaseRun never matches a hand-back (replays.sql ReleasedBy).
-- not null: handed_back
WITH t AS (
    SELECT * FROM unnest(:run_ids::uuid[], :attempts::int[], :from_statuses::text[]) AS t(run_id, attempt, from_status)
),
upd AS (
    UPDATE awooop_run_state r
       SET status = t.from_status, released_count = r.released_count + 1,
           lease_until = NULL, worker_id = NULL, not_before = NULL, updated_at = now()
      FROM t
     WHERE r.run_id = ANY(:run_ids::uuid[])
       AND r.run_id = t.run_id AND r.attempt_count = t.attempt AND r.worker_id = :worker_id
       AND r.status = 'RUNNING' AND NOT r.cancel_requested
 RETURNING r.run_id, r.project_id, r.attempt_count, r.status
),
aud AS (  -- one call of the log's writer for the batch (not a subtransaction per run: migration 0420)
    SELECT awooop_record_history(array_agg(ROW(project_id, run_id, :actor, 'RELEASED', 'RUNNING', status,
               :reason::text, jsonb_build_object('attempt', attempt_count, 'worker_id', :worker_id::text)
           )::awooop_history_row ORDER BY run_id)) AS recorded
      FROM upd
),
notified AS (
    SELECT count(pg_notify('awooop_run_ready', project_id)) AS n FROM (SELECT DISTINCT project_id FROM upd) p
)
SELECT (SELECT count(*) FROM upd) AS handed_back, (SELECT n FROM notified) AS notified, (SELECT recorded FROM aud)

-- name: ReplayClaimAnswer :many
-- The answer recorded for a claim id (:principal, :worker_id, :claim_id; claim_answers.py): its
-- parameters, and its runs that still hold the lease it granted (same attempt, still RUNNING or
-- WAITING_TOOL, same worker; lease_until as renewed since), in the claim's answer order. One row
-- with NULL run columns when none does; no row when none is recorded.
-- not null: first_projects, first_max_runs, first_lease_ttl, first_claimed_at
SELECT a.project_ids AS first_projects, a.max_runs AS first_max_runs, a.lease_ttl AS first_lease_ttl,
       a.created_at AS first_claimed_at, c.*
  FROM awooop_claim_answer a
  LEFT JOIN LATERAL (
       SELECT r.*,
              NULL::text AS from_status, NULL::float8 AS claim_wait
         FROM unnest(a.run_ids, a.attempts) AS t(run_id, attempt)
         JOIN awooop_run_state r ON r.run_id = t.run_id
        WHERE r.run_id = ANY(a.run_ids) AND r.attempt_count = t.attempt AND r.status IN ('RUNNING', 'WAITING_TOOL') AND r.worker_id = a.worker_id
  ) c ON true
 WHERE a.principal = :principal AND a.worker_id = :worker_id AND a.claim_id = :claim_id
 ORDER BY c.priority DESC, c.created_at

-- name: PruneClaimAnswers :exec
-- Answers whose lease would have expired unrenewed: up to :batch per statement, picked with SKIP
-- LOCKED so that replicas prune disjoint rows.
DELETE FROM awooop_claim_answer
 WHERE (principal, worker_id, claim_id) IN (
        SELECT principal, worker_id, claim_id FROM awooop_claim_answer
         WHERE expires_at < now()
         LIMIT :batch
           FOR UPDATE SKIP LOCKED)
