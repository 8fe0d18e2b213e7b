"""An invariant soak (issue 25): every service a real process on a Postgres of the test's own,
six projects with mixed flow settings (retry policies, weights, concurrency and rate keys, one
project paused until late), cron schedules (and one whose ticks run out), events submitted over
gRPC the whole time by producers that retry until acknowledged, three SDK worker processes
whose handlers journal a compensatable tool step and sometimes fail (retryably and not), and
crashes: workers SIGKILLed and restarted, the scheduler SIGKILLed and restarted twice, Postgres
restarted once.

Checked while it runs (tests/harness/soak_invariants.py, a sample every 0.2 s): every expired
lease reaped within the lease TTL + reaper interval + slack (outages excused), no concurrency key
over its limit and every key's slot count equal to its leased runs (no slot held by a finished
run), no run parked on a key with a free slot (a lost wake-up), no rate window over its starts,
no run claimed past its attempts, no run of the paused project claimed. At the end: every run
terminal as its plan says, every failed run with a completed compensatable step compensated (its
knowledge entry deleted), every acknowledged event exactly one run and no run nobody sent, one
run per cron tick and no schedule that stopped, no INTERNAL/UNKNOWN answer to any client
(producers, the test's calls, the workers' SDK calls) and no bug logged by a service.

Seeded: AWOOOP_SOAK_SEED=<n> repeats a soak's plan (events, outcomes, crash times); without it a
random seed is printed. A failure names the seed. Two to three minutes on a 2-core machine."""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
from google.protobuf import duration_pb2

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2 as spb
from awooop.worker import AwooopError, Client, to_struct
from services.common import principals
from services.common.embedded import free_port
from services.common.settings import Settings
from tests.harness import soak_plan
from tests.harness.helpers import ROOT, ServiceProcess, eventually, settings_env, spawn_services
from tests.harness.pgcluster import PgCluster, create_migrated_db
from tests.harness.soak_invariants import (
    Monitor,
    Outages,
    Submitted,
    Violations,
    check_answers_and_logs,
    check_schedule_ticks,
    check_store,
    client_errors,
    unsettled,
)
from tests.harness.soak_plan import PROJECTS, Crash, Project, RunPlan, SoakPlan

LEASE_TTL = 2.0
REAPER_INTERVAL = 0.5
SCHEDULE_INTERVAL = 0.25
SLACK = 3.0  # a loaded 2-core machine; the checks are conditions, this only bounds them
PRODUCERS = 3
DRAIN_SECONDS = 60.0
PROJECT_LIST = ",".join(p.name for p in PROJECTS)
CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}

SERVICE_ENV = {
    "AWOOOP_REAPER_INTERVAL": str(REAPER_INTERVAL),
    "AWOOOP_SCHEDULE_INTERVAL": str(SCHEDULE_INTERVAL),
    "AWOOOP_LEASE_TTL": str(LEASE_TTL),
    "AWOOOP_HEARTBEAT_INTERVAL": str(LEASE_TTL / 4),
    "AWOOOP_RETRY_BACKOFF": "0.2",
    "AWOOOP_RETRY_MAX_BACKOFF": "1",
    "AWOOOP_COMPENSATION_INTERVAL": "0.3",
    "AWOOOP_SHUTDOWN_GRACE": "1",
    "AWOOOP_DB_CONNECT_TIMEOUT": "2",
    "AWOOOP_DB_POOL_MIN": "1",
    "AWOOOP_QUEUE_METRICS_INTERVAL": "0",
}


def _dur(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


async def _service_key(dsn: str, name: str) -> str:
    """A service principal's key with admin in every project (as AWOOOP_INTERNAL_API_KEY)."""
    conn = await asyncpg.connect(dsn)
    try:
        await principals.create_principal(conn, name, "service")
        await principals.grant_role(conn, name, principals.ALL_PROJECTS, "admin")
        return (await principals.issue_key(conn, name)).key
    finally:
        await conn.close()


@dataclass
class Tally:
    """Every answer a client of the soak got, by method and code (and reason)."""

    seen: collections.Counter[str] = field(default_factory=collections.Counter)

    def failed(self, err: AwooopError) -> None:
        self.seen[f"{err.method.rsplit('/', 1)[-1]} {err.code.name}/{err.reason}"] += 1


@dataclass
class Suite:
    """The soak's processes: services, workers, and their restarts."""

    tmp: Path
    env: dict[str, str]
    ports: dict[str, int]
    worker_env: dict[str, str]
    services: dict[str, ServiceProcess] = field(default_factory=dict)
    workers: list[subprocess.Popen[bytes] | None] = field(default_factory=list)
    worker_errors: list[Path] = field(default_factory=list)
    logs: dict[str, Path] = field(default_factory=dict)
    starts: collections.Counter[str] = field(default_factory=collections.Counter)

    def addr(self, service: str) -> str:
        return f"127.0.0.1:{self.ports[service]}"

    async def start_service(self, service: str, extra: dict[str, str]) -> None:
        self.starts[service] += 1
        name = f"{service}-{self.starts[service]}"
        # a loaded CI machine can take long to start four Python processes at once
        sp = await spawn_services([service], self.env | extra, self.tmp, name, fixed=self.ports, healthy_within=60)
        self.services[service] = sp
        self.logs[name] = sp.log_path

    def start_worker(self, i: int) -> None:
        self.starts[f"worker{i}"] += 1
        name = f"worker{i}-{self.starts[f'worker{i}']}"
        errors = self.tmp / f"{name}.errors"
        self.worker_errors.append(errors)
        self.logs[name] = self.tmp / f"{name}.log"
        with open(self.logs[name], "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "soak_worker.py"), name, PROJECT_LIST, str(errors)],
                env=self.worker_env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        while len(self.workers) <= i:
            self.workers.append(None)
        self.workers[i] = proc

    def kill_worker(self, i: int) -> None:
        proc = self.workers[i]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop_all(self) -> None:
        for i in range(len(self.workers)):
            self.kill_worker(i)
        for sp in self.services.values():
            sp.kill()

    def read_logs(self) -> dict[str, str]:
        return {name: p.read_text(errors="replace") for name, p in self.logs.items() if p.exists()}


def _worker_env(admin_key: str, ports: dict[str, int], lease_ttl: float) -> dict[str, str]:
    """A soak worker process's environment: this one's without AWOOOP_ settings, then the
    services' addresses, the admin key and the lease the worker asks for."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {
        "AWOOOP_API_KEY": admin_key,
        "AWOOOP_SCHEDULER_ADDR": f"127.0.0.1:{ports['scheduler']}",
        "AWOOOP_SAGA_ADDR": f"127.0.0.1:{ports['saga']}",
        "AWOOOP_GATEWAY_ADDR": f"127.0.0.1:{ports['gateway']}",
        "AWOOOP_SOAK_LEASE_TTL": str(lease_ttl),
    }


async def test_invariants_hold_through_crashes_restarts_and_mixed_flow(
    settings: Settings, pg_cluster: PgCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = soak_plan.make_plan()
    began = time.time()
    phases: dict[str, float] = {}
    monkeypatch.delenv(soak_plan.SEED_ENV, raising=False)  # not a setting of the services it starts
    print(f"\ninvariant soak: seed {plan.seed} ({soak_plan.SEED_ENV}={plan.seed} repeats it)")
    dsn = await create_migrated_db(pg_cluster.primary.dsn, "awooop")
    internal = await _service_key(dsn, "soak-internal")
    admin_key = await _service_key(dsn, "soak-admin")
    ports = {s: free_port() for s in ("ingest", "scheduler", "saga", "gateway")}
    env = settings_env(settings.with_(database_url=dsn)) | SERVICE_ENV | {"AWOOOP_INTERNAL_API_KEY": internal}
    env.pop("AWOOOP_DATABASE_DIRECT_URL", None)
    suite = Suite(
        tmp_path,
        env,
        ports,
        worker_env=_worker_env(admin_key, ports, LEASE_TTL),
    )
    extra = {
        "saga": {"AWOOOP_GATEWAY_ADDR": suite.addr("gateway")},
        "scheduler": {"AWOOOP_SAGA_ADDR": suite.addr("saga")},
        "ingest": {},
        "gateway": {},
    }
    violations = Violations()
    outages = Outages()
    tally = Tally()
    submitted = Submitted()
    statuses: dict[str, int] = {}
    ticks: dict[str, int] = {}
    worker_seen: collections.Counter[str] = collections.Counter()
    samples = 0
    worst: dict[str, int] = {}
    latest_reap = 0.0
    client = Client(key=admin_key, ingest=suite.addr("ingest"), scheduler=suite.addr("scheduler"), timeout=5.0)
    try:
        await asyncio.gather(*(suite.start_service(s, extra[s]) for s in ("gateway", "saga", "ingest", "scheduler")))
        await _set_up_projects(client, tally)
        for i in range(soak_plan.WORKERS):
            suite.start_worker(i)

        # a lease ends LEASE_TTL after its last heartbeat; the reaper takes it within an interval
        monitor = Monitor(dsn, outages, REAPER_INTERVAL + SLACK, violations)
        stop_load, stop_monitor = asyncio.Event(), asyncio.Event()
        t0 = time.time()
        phases["set-up"] = t0 - began
        monitor_task = asyncio.create_task(monitor.run(stop_monitor))
        producers = [
            asyncio.create_task(_produce(client, plan.stream(i), submitted, tally, violations, stop_load))
            for i in range(PRODUCERS)
        ]
        chaos = asyncio.create_task(_chaos(plan, suite, extra, pg_cluster, outages, t0))
        admin = asyncio.create_task(_admin_timeline(client, monitor, tally, violations, t0))
        once_cron = await admin
        # the load's length (not a wait for a condition)
        await asyncio.sleep(max(0.0, t0 + soak_plan.LOAD_SECONDS - time.time()))
        stop_load.set()
        await asyncio.gather(*producers, chaos)
        load_ended = time.time()
        phases["load"] = load_ended - t0

        async def settled() -> bool:
            running, compensating = await unsettled(dsn)
            return running == 0 and compensating == 0

        try:
            await eventually(settled, timeout=DRAIN_SECONDS, interval=0.5, what="every run terminal and compensated")
            phases["drain"] = time.time() - load_ended
        except AssertionError as err:
            violations.add("soak did not settle", str(err))
        stop_monitor.set()
        await monitor_task
        samples, worst, latest_reap = monitor.samples, dict(monitor.worst_running), monitor.latest_reap

        statuses = await check_store(dsn, submitted, violations)
        ticks = await _check_schedules(dsn, t0 + 2, load_ended, outages, once_cron, violations)
        worker_seen = client_errors(suite.worker_errors)
        check_answers_and_logs(worker_seen, tally.seen, suite.read_logs(), violations)
    except BaseException as err:
        err.add_note(f"invariant soak seed {plan.seed} (rerun with {soak_plan.SEED_ENV}={plan.seed})")
        raise
    finally:
        await client.close()
        suite.stop_all()

    crashes = [(round(c.at, 1), c.what) for c in plan.crashes]
    down = [(o.what, round((o.end or 0) - o.start, 1)) for o in outages.spans]
    print(
        f"invariant soak (seed {plan.seed}): {len(submitted.plans)} events sent, {len(submitted.acked)} "
        f"acknowledged; runs {statuses}; schedule ticks {ticks}; {samples} samples; an expired lease "
        f"reaped at most {latest_reap:.1f}s late; most leased per key {worst}; crashes {crashes}; "
        f"outages {down}; client answers {dict(tally.seen)}; workers' failed calls {dict(worker_seen)}; "
        f"seconds { ({k: round(v, 1) for k, v in phases.items()}) }"
    )
    assert not violations.counts, (
        f"invariant soak seed {plan.seed} broke (rerun with {soak_plan.SEED_ENV}={plan.seed}):\n{violations.report()}"
    )


async def _call(client: Client, tally: Tally, method: Any, request: Any) -> Any:
    """An admin call, retried while the scheduler or the store is down (UNAVAILABLE)."""
    while True:
        try:
            return await client.call(method, request)
        except AwooopError as err:
            tally.failed(err)
            if err.code != grpc.StatusCode.UNAVAILABLE:
                raise
            await asyncio.sleep(0.2)


async def _set_up_projects(client: Client, tally: Tally, projects: Sequence[Project] = PROJECTS) -> None:
    """Each project's flow settings, keys, pause and schedules (the waits soak's too)."""
    sched = client.scheduler
    for p in projects:
        if p.weight:
            policy = common_pb2.RetryPolicy(
                initial_backoff=_dur(p.initial_backoff) if p.initial_backoff else None,
                max_backoff=_dur(p.max_backoff) if p.max_backoff else None,
                max_attempts=p.max_attempts,
                non_retryable_error_codes=list(p.non_retryable),
            )
            req = spb.SetProjectFlowRequest(project_id=p.name, retry_policy=policy, weight=p.weight)
            await _call(client, tally, sched.SetProjectFlow, req)
        for limit in p.limits:
            lim = spb.SetConcurrencyLimitRequest(
                project_id=p.name,
                key=limit.key,
                max_running=limit.max_running,
                max_starts=limit.max_starts,
                per=_dur(limit.per_seconds) if limit.max_starts else None,
            )
            await _call(client, tally, sched.SetConcurrencyLimit, lim)
        if p.paused:
            await _call(client, tally, sched.PauseProject, spb.PauseProjectRequest(project_id=p.name, reason="soak"))
        for name, cron in p.schedules:
            schedule = spb.Schedule(project_id=p.name, name=name, cron=cron, time_zone="UTC")
            await _call(client, tally, sched.SetSchedule, spb.SetScheduleRequest(schedule=schedule))


def _event(p: RunPlan) -> ingest_pb2.IngestEventRequest:
    return ingest_pb2.IngestEventRequest(
        project_id=p.project,
        channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM,
        provider_event_id=p.event_id,
        payload=to_struct({"update_id": 1, "soak": p.event_id}),
        input=to_struct({"soak": {"outcome": p.outcome, "work_ms": p.work_ms}}),
        priority=p.priority,
        concurrency_keys=list(p.keys),
    )


async def _produce(
    client: Client,
    stream: soak_plan.RunStream,
    submitted: Submitted,
    tally: Tally,
    violations: Violations,
    stop: asyncio.Event,
) -> None:
    """Sends events until stopped, each retried until acknowledged (as a provider does), now and
    then one already acknowledged again (which must answer the same run, as a duplicate)."""
    mine: list[str] = []
    while not stop.is_set():
        batch = [stream.next_run() for _ in range(stream.batch_size())]
        for p in batch:
            submitted.plans[p.event_id] = p
        pending = batch
        while pending and not stop.is_set():
            pending = await _submit(client, pending, submitted, tally, violations)
            if pending:
                await asyncio.sleep(0.2)
        mine += [p.event_id for p in batch if p.event_id in submitted.acked]
        if mine and stream.resend():
            again = submitted.plans[stream.rng.choice(mine)]
            await _submit(client, [again], submitted, tally, violations, resend=True)
        await asyncio.sleep(stream.pause())


async def _submit(
    client: Client,
    batch: list[RunPlan],
    submitted: Submitted,
    tally: Tally,
    violations: Violations,
    *,
    resend: bool = False,
) -> list[RunPlan]:
    """One IngestEvent (one plan) or IngestEvents call; returns the plans not acknowledged."""
    try:
        if len(batch) == 1:
            one = await client.call(client.ingest.IngestEvent, _event(batch[0]))
            answers: list[tuple[RunPlan, Any]] = [(batch[0], one)]
        else:
            many = await client.call(
                client.ingest.IngestEvents, ingest_pb2.IngestEventsRequest(events=[_event(p) for p in batch])
            )
            answers = list(zip(batch, many.results, strict=True))
    except AwooopError as err:
        tally.failed(err)
        return batch
    left = []
    for p, answer in zip(batch, (a for _, a in answers), strict=True):
        if answer.HasField("error"):
            tally.seen[f"IngestEvents[item] {CODE_NAMES.get(answer.error.code, answer.error.code)}/"] += 1
            left.append(p)
            continue
        (outcome,) = answer.outcomes
        known = submitted.acked.get(p.event_id)
        if known is not None and known != outcome.run_id:
            violations.add("an event answered with two runs", f"{p.event_id}: {known} then {outcome.run_id}")
        if resend and not outcome.duplicate:
            violations.add("a re-sent event not answered as a duplicate", p.event_id)
        submitted.acked[p.event_id] = outcome.run_id
    return left


async def _chaos(
    plan: SoakPlan, suite: Suite, extra: dict[str, dict[str, str]], pg: PgCluster, outages: Outages, t0: float
) -> None:
    """The plan's crashes at their times: SIGKILL a worker or the scheduler and start it again
    after a while, or restart Postgres."""
    for n, crash in enumerate(plan.crashes):
        await asyncio.sleep(max(0.0, t0 + crash.at - time.time()))  # a schedule of faults, not a wait
        await _crash(crash, n, plan, suite, extra, pg, outages)


async def _crash(
    crash: Crash,
    n: int,
    plan: SoakPlan,
    suite: Suite,
    extra: dict[str, dict[str, str]],
    pg: PgCluster,
    outages: Outages,
) -> None:
    if crash.what == "worker":
        i = plan.worker_to_kill(n)
        suite.kill_worker(i)
        await asyncio.sleep(crash.down_for)
        suite.start_worker(i)
    elif crash.what == "scheduler":
        o = outages.begin("scheduler")
        suite.services["scheduler"].kill()
        await asyncio.sleep(crash.down_for)
        await suite.start_service("scheduler", extra["scheduler"])
        outages.end(o)
    else:
        o = outages.begin("postgres")
        await asyncio.to_thread(pg.primary.restart, "fast")
        outages.end(o)


async def _admin_timeline(client: Client, monitor: Monitor, tally: Tally, violations: Violations, t0: float) -> str:
    """The operator's part: a schedule that never fires (refused) and one whose only tick comes
    soon, then the paused project resumed late in the load. Returns the one-tick schedule's cron."""
    await asyncio.sleep(max(0.0, t0 + 4 - time.time()))
    never = spb.Schedule(project_id=soak_plan.BAD_SCHEDULE_PROJECT, name="never", cron=soak_plan.NEVER_CRON)
    try:
        await _call(client, tally, client.scheduler.SetSchedule, spb.SetScheduleRequest(schedule=never))
        violations.add("a cron that never fires accepted", soak_plan.NEVER_CRON)
    except AwooopError as err:
        if err.code != grpc.StatusCode.INVALID_ARGUMENT:
            violations.add("a cron that never fires not refused as INVALID_ARGUMENT", str(err))
    cron = soak_plan.once_cron(time.time() + 3)
    once = spb.Schedule(project_id=soak_plan.BAD_SCHEDULE_PROJECT, name=soak_plan.BAD_SCHEDULE_NAME, cron=cron)
    await _call(client, tally, client.scheduler.SetSchedule, spb.SetScheduleRequest(schedule=once))
    await asyncio.sleep(max(0.0, t0 + soak_plan.RESUME_AT - time.time()))
    monitor.paused = False
    resume = spb.ResumeProjectRequest(project_id=soak_plan.PAUSED, reason="soak")
    await _call(client, tally, client.scheduler.ResumeProject, resume)
    return cron


SCHEDULE_TICKS_SQL = """
SELECT project_id, provider_event_id FROM awooop_run_state WHERE provider_event_id LIKE 'schedule:%'
"""


async def _check_schedules(
    dsn: str, started: float, ended: float, outages: Outages, once_cron: str, violations: Violations
) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(SCHEDULE_TICKS_SQL)
    finally:
        await conn.close()
    by_name: dict[str, list[str]] = collections.defaultdict(list)
    for r in rows:
        by_name[r["provider_event_id"].split(":", 2)[1]].append(r["provider_event_id"])
    fired = {}
    for p in PROJECTS:
        for name, cron in p.schedules:
            period = soak_plan.period_of(cron)
            fired[name] = check_schedule_ticks(
                by_name[name], period, name, started, ended, outages, SCHEDULE_INTERVAL + SLACK, violations
            )
    once = by_name.get(soak_plan.BAD_SCHEDULE_NAME, [])
    if len(once) != 1:
        violations.add("a schedule with one tick did not fire exactly once", f"{once_cron}: {once}")
    fired[soak_plan.BAD_SCHEDULE_NAME] = len(once)
    return fired
