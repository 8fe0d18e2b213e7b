"""How the services' statements are planned: with sequential scans priced out.

Every statement a service runs finds its rows through an index (a primary key, a partial index
of unfinished runs, a run's log). Postgres plans a prepared statement afresh for its first five
calls on a connection, then keeps a generic plan costed on the tables as they were at that
moment, until the table is next analyzed; PL/pgSQL functions keep their statements' plans the same
way. A plan made while awooop_run_state was empty or small (a new install's first minutes, a
first load test) scanned the whole table on every claim and heartbeat until autovacuum's next
analyze: at 65,000 runs 7,400 buffers a claim statement and 1,600 a heartbeat of ten leases,
three times Postgres's CPU per run (docs/benchmarks.md, "Plans made on an empty table").

`enable_seqscan = off` adds a large cost to a sequential scan without forbidding it: a plan made
on an empty table takes the index, and a statement with no index to use still scans. That scan
then carries the large cost, and above `jit_above_cost` Postgres JIT-compiles the statement on
every call (measured: the queue gauges' sample 3 -> 134 ms, the live key ids' refresh 55 ms), so
JIT is off too; the services' statements are short, and JIT never pays for itself on them. Direct
connections get it as a startup parameter (services/common/db.py), the plan functions a pooler's
connections call as a SET clause of each function (services/common/server_plans.py); through a
pooler, statements that run plain are planned on every call and see the tables as they are.
"""

from __future__ import annotations

SETTINGS: dict[str, str] = {"enable_seqscan": "off", "jit": "off"}
