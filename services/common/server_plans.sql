-- Statements of services/common/server_plans.py (the plan functions of hot statements).

-- name: PlanFunctions :many
-- not null: name, oid, callable
-- The plan functions visible on this connection's search_path (callable by name), whether its
-- role may EXECUTE them, and each one's comment (a digest of its definition). A service reads
-- them once per pool and again after a call failed as stale; the migration step reads them to
-- create only what is missing. The prefix is server_plans.PREFIX (`_` escaped for LIKE).
SELECT p.proname::text AS name,
       p.oid::int8 AS oid,
       has_function_privilege(p.oid, 'EXECUTE') AS callable,
       obj_description(p.oid, 'pg_proc') AS comment
  FROM pg_proc p
 WHERE p.proname::text LIKE 'awooop\_plan\_%'
   AND pg_function_is_visible(p.oid)

-- name: TypeNames :many
-- not null: oid, name
-- The SQL names of types by oid: the parameter and result types of statements, written into
-- the signatures of their functions.
SELECT t AS oid, format_type(t, NULL) AS name
  FROM unnest(:oids::oid[]) AS u(t)
