"""The invariant soak's checks (tests/test_invariant_soak.py): a monitor that samples the store
while the soak runs, and the checks of the store at its end. Each broken rule is recorded as a
`Violations` entry (a count and the first examples), so one run reports every rule it broke."""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from tests.harness import soak_plan
from tests.harness.soak_plan import RunPlan

LEASED = "('RUNNING', 'WAITING_TOOL')"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
BAD_CODES = ("INTERNAL", "UNKNOWN")

# --- sampled while the soak runs ------------------------------------------------------------------

# Expired leases the reaper has not taken yet (a lease ends TTL after its last heartbeat).
EXPIRED_LEASES_SQL = f"""
SELECT run_id::text, project_id, worker_id, extract(epoch FROM lease_until)::float8 AS lease_until
  FROM awooop_run_state
 WHERE status IN {LEASED} AND lease_until < now()
"""

# Each limited key's slot count against the leased runs that carry it, in one snapshot.
KEY_SLOTS_SQL = f"""
WITH leased AS (
    SELECT project_id, k AS key, count(*) AS n
      FROM awooop_run_state CROSS JOIN LATERAL unnest(concurrency_keys) AS k
     WHERE status IN {LEASED} AND worker_id IS NOT NULL  -- a run parked on a durable wait holds no slot
     GROUP BY project_id, k
)
SELECT l.project_id, l.key, l.max_running, l.running, COALESCE(x.n, 0) AS leased,
       l.max_starts, l.window_starts
  FROM awooop_concurrency_limit l LEFT JOIN leased x USING (project_id, key)
"""

# Runs parked on a key (key_busy) while the key has a free slot and no queued run with the key
# is left to take it: a wake-up lost when a slot was given back. (A release wakes as many parked
# runs as it frees slots; the rest stay parked while the woken ones wait for a claim, and a woken
# run that another key blocks passes the wake-up on.) A moment of it is a claim in flight; for
# longer than the slack it is a stuck queue.
PARKED_ON_FREE_KEY_SQL = """
SELECT r.run_id::text, r.project_id, r.wait_key, l.running, l.max_running
  FROM awooop_run_state r
  JOIN awooop_concurrency_limit l ON l.project_id = r.project_id AND l.key = r.wait_key
 WHERE r.status IN ('PENDING', 'RESUMED') AND r.wait_reason = 'key_busy' AND l.running < l.max_running
   AND NOT EXISTS (SELECT 1 FROM awooop_run_state q
                    WHERE q.project_id = r.project_id AND q.status IN ('PENDING', 'RESUMED')
                      AND r.wait_key = ANY(q.concurrency_keys) AND q.wait_reason IS DISTINCT FROM 'key_busy')
"""

# Runs claimed more often than their attempts allow (hand-backs do not count).
OVER_ATTEMPTS_SQL = """
SELECT run_id::text, attempt_count, released_count, max_attempts
  FROM awooop_run_state WHERE attempt_count - released_count > max_attempts
"""

# Runs of a paused project that a claim took anyway.
CLAIMED_WHILE_PAUSED_SQL = "SELECT run_id::text FROM awooop_run_state WHERE project_id = $1 AND attempt_count > 0"

# --- read at the end ----------------------------------------------------------------------------

RUNS_SQL = """
SELECT run_id::text, project_id, provider_event_id, status, error_code, saga_status,
       input -> 'soak' ->> 'outcome' AS outcome
  FROM awooop_run_state
"""

# The step that wrote a knowledge entry, with the compensation command that deletes it.
REMEMBER_STEPS_SQL = """
SELECT run_id::text, status, compensation_cmd IS NOT NULL AS compensatable
  FROM awooop_saga_step WHERE step_id = 'remember'
"""

KNOWLEDGE_SQL = "SELECT entry_id FROM awooop_refgw_knowledge"

# What a run that did not end was doing, and its history, for the failure message.
STUCK_RUN_SQL = """
SELECT r.status, r.worker_id, r.attempt_count, r.released_count, r.max_attempts,
       to_char(r.lease_until, 'HH24:MI:SS.MS') AS lease_until,
       to_char(r.heartbeat_at, 'HH24:MI:SS.MS') AS heartbeat_at, r.wait_reason, r.wait_key,
       (SELECT string_agg(a.action || ' ' || to_char(a.created_at, 'HH24:MI:SS.MS') || ' ' || a.actor
                          || COALESCE(' ' || (a.details ->> 'worker_id'), ''), '; ' ORDER BY a.audit_id)
          FROM awooop_audit_log a WHERE a.run_id = r.run_id) AS history
  FROM awooop_run_state r WHERE r.run_id = $1::uuid
"""

UNSETTLED_SQL = f"""
SELECT count(*) FILTER (WHERE status NOT IN {TERMINAL!r}) AS running,
       count(*) FILTER (WHERE saga_status IN ('in_progress', 'compensating') AND status IN {TERMINAL!r}) AS compensating
  FROM awooop_run_state
"""


@dataclass
class Violations:
    """Broken rules: how often each was seen and its first examples."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    _seen: set[tuple[str, str]] = field(default_factory=set)

    def add(self, rule: str, example: str, subject: str = "") -> None:
        """subject: what broke it (a run, a key); seen again in a later sample it counts once."""
        if subject:
            if (rule, subject) in self._seen:
                return
            self._seen.add((rule, subject))
        self.counts[rule] += 1
        if len(self.examples.setdefault(rule, [])) < 3:
            self.examples[rule].append(example)

    def report(self) -> str:
        return "\n".join(f"- {rule} ({n}x), e.g. {self.examples[rule]}" for rule, n in self.counts.items())


@dataclass
class Outage:
    what: str
    start: float  # time.time()
    end: float | None = None


@dataclass
class Outages:
    """When the scheduler (reaper, schedules) or Postgres was down: the reaper and the schedule
    pass cannot act then, so their deadlines move past the outage."""

    spans: list[Outage] = field(default_factory=list)

    def begin(self, what: str) -> Outage:
        o = Outage(what, time.time())
        self.spans.append(o)
        return o

    @staticmethod
    def end(o: Outage) -> None:
        o.end = time.time()

    def deadline(self, since: float, grace: float) -> float:
        """When something due at `since` must have happened: grace seconds of service after it,
        extended over every outage that began before that; inf while such an outage lasts."""
        t = since
        for o in sorted(self.spans, key=lambda o: o.start):
            if o.start <= t + grace and (o.end is None or o.end >= t):
                if o.end is None:
                    return float("inf")
                t = max(t, o.end)
        return t + grace

    def overlaps(self, start: float, end: float) -> bool:
        return any(o.start <= end and (o.end is None or o.end >= start) for o in self.spans)


class Monitor:
    """Samples the store's invariants until stopped: overdue leases, key slots against leased
    runs, attempts, and (while paused) claims in the paused project."""

    def __init__(self, dsn: str, outages: Outages, reap_grace: float, violations: Violations) -> None:
        """reap_grace: how long past its end a lease may stay unreaped while the scheduler and
        Postgres are up (the reaper interval and slack)."""
        self.dsn, self.outages, self.reap_grace, self.violations = dsn, outages, reap_grace, violations
        self.latest_reap = 0.0  # the longest an expired lease stayed unreaped, outages aside
        self.parked_since: dict[str, float] = {}  # run parked on a key with room -> first seen
        self.paused = True  # cleared by the test before it resumes the paused project
        self.paused_project = soak_plan.PAUSED  # which project that is
        self.samples = 0
        self.worst_running: collections.Counter[str] = collections.Counter()

    async def run(self, done: asyncio.Event) -> None:
        conn: asyncpg.Connection | None = None
        while not done.is_set():
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(self.dsn, timeout=2)
                await self.sample(conn)
                self.samples += 1
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, TimeoutError):
                # Postgres restarting (a connection cut mid-statement can be left unusable):
                # sample again on a new connection once it is back
                if conn is not None:
                    conn.terminate()
                conn = None
            await asyncio.sleep(0.2)
        if conn is not None:
            await conn.close()

    async def sample(self, conn: asyncpg.Connection) -> None:
        now = time.time()
        for r in await conn.fetch(EXPIRED_LEASES_SQL):
            deadline = self.outages.deadline(r["lease_until"], self.reap_grace)
            if deadline != float("inf"):
                self.latest_reap = max(self.latest_reap, now - (deadline - self.reap_grace))
            if now > deadline:
                late = now - r["lease_until"]
                self.violations.add(
                    "expired lease not reaped in time",
                    f"run {r['run_id']} ({r['project_id']}, worker {r['worker_id']}) expired {late:.1f}s ago",
                    r["run_id"],
                )
        for r in await conn.fetch(KEY_SLOTS_SQL):
            where = f"{r['project_id']}/{r['key']}"
            self.worst_running[where] = max(self.worst_running[where], r["leased"])
            if r["max_running"] is not None and r["leased"] > r["max_running"]:
                self.violations.add(
                    "concurrency key over its limit", f"{where}: {r['leased']} > {r['max_running']}", where
                )
            if r["running"] != r["leased"]:
                self.violations.add(
                    "key slots differ from leased runs (a slot held by a finished run, or a run without one)",
                    f"{where}: {r['running']} slots, {r['leased']} leased runs",
                    where,
                )
            if r["max_starts"] is not None and r["window_starts"] > r["max_starts"]:
                self.violations.add(
                    "rate key over its starts", f"{where}: {r['window_starts']} > {r['max_starts']}", where
                )
        parked = {r["run_id"]: r for r in await conn.fetch(PARKED_ON_FREE_KEY_SQL)}
        self.parked_since = {run_id: self.parked_since.get(run_id, now) for run_id in parked}
        for run_id, since in self.parked_since.items():
            if now - since > self.reap_grace:
                r = parked[run_id]
                self.violations.add(
                    "run parked on a key with a free slot (a lost wake-up)",
                    f"run {run_id} ({r['project_id']}/{r['wait_key']}: {r['running']} of {r['max_running']})",
                    run_id,
                )
        for r in await conn.fetch(OVER_ATTEMPTS_SQL):
            self.violations.add("run claimed past its attempts", str(dict(r)), r["run_id"])
        if self.paused:
            for r in await conn.fetch(CLAIMED_WHILE_PAUSED_SQL, self.paused_project):
                self.violations.add("run of a paused project claimed", r["run_id"], r["run_id"])


async def unsettled(dsn: str) -> tuple[int, int]:
    """(runs not terminal, terminal runs whose compensation is still open)."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(UNSETTLED_SQL)
    finally:
        await conn.close()
    assert row is not None
    return row["running"], row["compensating"]


# --- the end ------------------------------------------------------------------------------------

# outcome -> the error codes its FAILED run may carry (a run whose leases kept expiring fails
# with the reaper's code whatever its handler would have done)
FAILED_CODES = {
    "ok": {soak_plan.MAX_ATTEMPTS_CODE},
    "flaky": {soak_plan.MAX_ATTEMPTS_CODE},
    "doomed": {soak_plan.HANDLER_CODE, soak_plan.MAX_ATTEMPTS_CODE},
    "fatal": {soak_plan.FATAL_CODE, soak_plan.MAX_ATTEMPTS_CODE},
    "nonretry": {soak_plan.NONRETRY_CODE, soak_plan.MAX_ATTEMPTS_CODE},
    "": {soak_plan.MAX_ATTEMPTS_CODE},  # schedule ticks: their handler completes
}
COMPLETES = {"ok", "flaky", ""}


@dataclass
class Submitted:
    """What the producers sent and what ingest acknowledged."""

    plans: dict[str, RunPlan] = field(default_factory=dict)  # event id -> plan, once sent
    acked: dict[str, str] = field(default_factory=dict)  # event id -> run id, once acknowledged


async def check_store(dsn: str, submitted: Submitted, violations: Violations) -> dict[str, int]:
    """The end state: runs terminal as their plans say, compensated when they failed after a
    compensatable step, every acknowledged event exactly one run and no run nobody asked for.
    Returns how many runs of each planned outcome ended how ("ok: COMPLETED", "ok: FAILED
    E-RUN-MAX-ATTEMPTS", ...)."""
    conn = await asyncpg.connect(dsn)
    try:
        runs = await conn.fetch(RUNS_SQL)
        steps = {r["run_id"]: r for r in await conn.fetch(REMEMBER_STEPS_SQL)}
        knowledge = {r["entry_id"] for r in await conn.fetch(KNOWLEDGE_SQL)}
        stuck = [r["run_id"] for r in runs if r["status"] not in TERMINAL][:3]
        details = {run_id: dict(await conn.fetchrow(STUCK_RUN_SQL, run_id) or {}) for run_id in stuck}
    finally:
        await conn.close()
    by_event: dict[str, list[Any]] = collections.defaultdict(list)
    statuses: collections.Counter[str] = collections.Counter()
    for r in runs:
        statuses[f"{r['outcome'] or 'schedule'}: {r['status']} {r['error_code'] or ''}".strip()] += 1
        by_event[r["provider_event_id"]].append(r)
        run = f"run {r['run_id']} ({r['project_id']}, {r['outcome'] or 'schedule'})"
        if r["status"] not in TERMINAL:
            violations.add("run not terminal at the end", f"{run}: {details.get(r['run_id'], r['status'])}")
            continue
        outcome = r["outcome"] or ""
        if r["status"] == "COMPLETED" and outcome not in COMPLETES:
            violations.add("run completed against its plan", run)
        if r["status"] == "FAILED" and r["error_code"] not in FAILED_CODES.get(outcome, set()):
            violations.add("run failed with an unexpected code", f"{run}: {r['error_code']}")
        if r["status"] == "CANCELLED":
            violations.add("run cancelled (nothing cancels in the soak)", run)
        _check_saga(r, steps.get(r["run_id"]), f"soak-{r['run_id']}" in knowledge, run, violations)
    for event_id, run_id in submitted.acked.items():
        found = by_event.get(event_id, [])
        if len(found) != 1:
            violations.add("acknowledged event without exactly one run", f"{event_id}: {len(found)} runs")
        elif found[0]["run_id"] != run_id:
            stored = found[0]["run_id"]
            violations.add("acknowledged event's run replaced", f"{event_id}: acked {run_id}, stored {stored}")
    for event_id, found in by_event.items():
        if not event_id.startswith("schedule:") and event_id not in submitted.plans:
            violations.add("run nobody submitted", f"{event_id}: {len(found)} runs")
        if len(found) > 1:
            violations.add("event with more than one run", f"{event_id}: {len(found)} runs")
    return dict(sorted(statuses.items()))


def _check_saga(r: Any, step: Any, entry_exists: bool, run: str, violations: Violations) -> None:
    """A failed run with a completed compensatable step is compensated (the entry deleted); a
    completed run keeps its entry; a run with nothing to undo is not_needed."""
    # a pending or failed step never completed: nothing of it is compensated (ADR-119)
    done_step = step is not None and step["compensatable"] and step["status"] not in ("pending", "failed")
    if r["status"] == "FAILED" and done_step:
        if r["saga_status"] != "compensated" or step["status"] != "compensated":
            violations.add(
                "failed run with a compensatable step not compensated",
                f"{run}: saga {r['saga_status']}, step {step['status']}",
            )
        elif entry_exists:
            violations.add("compensated run's side effect still there", run)
    elif r["status"] == "FAILED" and r["saga_status"] != "not_needed":
        violations.add("failed run with nothing to undo not marked not_needed", f"{run}: {r['saga_status']}")
    if r["status"] == "COMPLETED":
        if r["saga_status"] != "not_needed":
            violations.add("completed run's saga not closed", f"{run}: {r['saga_status']}")
        if step is None or step["status"] != "completed" or not entry_exists:
            violations.add("completed run's side effect missing", run)


def check_schedule_ticks(
    event_ids: list[str],
    period: int,
    name: str,
    started: float,
    ended: float,
    outages: Outages,
    grace: float,
    violations: Violations,
) -> int:
    """One run per tick, ticks on the cron grid, and no gap longer than the period plus grace
    while the scheduler and Postgres were up; returns the ticks fired."""
    # event ids are schedule:<name>:<tick in UTC>
    ticks = sorted(
        dt.datetime.strptime(e.split(":", 2)[2], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
        for e in event_ids
    )
    for t in ticks:
        if int(t) % 60 % period:
            violations.add("schedule tick off its cron grid", f"{name}: {dt.datetime.fromtimestamp(t, dt.UTC)}")
    edges = [started, *[t for t in ticks if t >= started], ended]
    for a, b in itertools.pairwise(edges):
        if b > outages.deadline(a, period + grace):
            violations.add(
                "schedule stopped ticking",
                f"{name}: no tick between {dt.datetime.fromtimestamp(a, dt.UTC):%H:%M:%S} "
                f"and {dt.datetime.fromtimestamp(b, dt.UTC):%H:%M:%S}",
            )
    return len(ticks)


def client_errors(paths: list[Path]) -> collections.Counter[str]:
    """'METHOD CODE/REASON' of every failed call the worker processes recorded."""
    seen: collections.Counter[str] = collections.Counter()
    for p in paths:
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            e = json.loads(line)
            seen[f"{e['method'].rsplit('/', 1)[-1]} {e['code']}/{e['reason']}"] += 1
    return seen


def bad_answers(seen: collections.Counter[str]) -> dict[str, int]:
    """The 'METHOD CODE/REASON' entries whose code is one of BAD_CODES."""
    return {k: v for k, v in seen.items() if k.split(" ")[1].split("/")[0] in BAD_CODES}


def check_answers_and_logs(
    worker_seen: collections.Counter[str],
    client_seen: collections.Counter[str],
    logs: dict[str, str],
    violations: Violations,
) -> None:
    """No worker (client_errors) and no client got INTERNAL/UNKNOWN, and no service logged a bug."""
    for what, n in bad_answers(worker_seen).items():
        violations.add("worker saw INTERNAL/UNKNOWN", f"{what}: {n}x")
    for what, n in bad_answers(client_seen).items():
        violations.add("client saw INTERNAL/UNKNOWN", f"{what}: {n}x")
    for bug, n in logged_bugs(logs).items():
        violations.add("service logged a bug", f"{bug} ({n}x)")


# log messages that are bugs whatever the soak did to the processes (the interceptor's and the
# background loops' unexpected exceptions, a pass's or one row's; store outages are warnings)
LOGGED_BUGS = ("unhandled error in", "background loop failed", "failed and was skipped")


def logged_bugs(logs: dict[str, str]) -> collections.Counter[str]:
    """'process: message (loop): the exception's last line' of every bug the services logged."""
    found: collections.Counter[str] = collections.Counter()
    for name, text in logs.items():
        for line in text.splitlines():
            if not any(b in line for b in LOGGED_BUGS):
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                found[f"{name}: {line[:300]}"] += 1
                continue
            exc = str(entry.get("exc", "")).strip().splitlines()
            where = f" ({entry['loop']})" if entry.get("loop") else ""
            found[f"{name.rsplit('-', 1)[0]}: {entry.get('msg')}{where}: {exc[-1] if exc else ''}"] += 1
    return found
