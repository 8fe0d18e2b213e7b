"""Durable waits with the other features (issue 27), soaked: every service a real process, three
projects with flow settings (retry policies, weights, a concurrency key, a rate key, one project
paused until mid-way, a cron schedule), runs submitted over gRPC the whole time, and three SDK
worker processes (tests/soak_waits_worker.py) SIGKILLed and restarted every few seconds. The runs
park on durable waits whose tokens the test completes by their callback URL (ingest's HTTP
server; the workers hand the URLs out in a file) or by CompleteWait with a key of the tool role,
some waits time out, some runs sleep, and some fan out to child runs that carry their parent's key
(tests/harness/soak_waits_plan.py).

Sampled while it runs (tests/harness/soak_invariants.py): expired leases reaped in time, no key
over its limit and every key's slots equal to its leased runs (a parked run holds none), no lost
wake-up on a key, no run claimed past its attempts, none of the paused project claimed. At the
end (tests/harness/soak_waits_checks.py): every run ended exactly once as its plan says (the
waits' outcomes through the path their plan names; a failed parent by its children's ends), no
tool side effect ran twice and no wait ended twice, the failed and timed-out runs compensated in
order (each run's steps newest first, a failed parent's completed children newest first before
its own steps), every acknowledged event one run, the schedule ticking, no INTERNAL/UNKNOWN answer
to any client, and no background loop recorded a failure: not in any service's metrics
(awooop_loop_errors_total, failed passes), logs, runs' histories or schedules.

Seeded like the invariant soak (AWOOOP_SOAK_SEED=<n> repeats a plan). About a minute."""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import asyncpg
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2 as spb
from awooop.worker import AwooopError, Client, to_struct
from services.common import errors, principals
from services.common.embedded import free_port
from services.common.settings import Settings
from tests.harness import soak_waits_plan as wp
from tests.harness.helpers import ROOT, eventually, settings_env, spawn_services
from tests.harness.soak_invariants import (
    Monitor,
    Outages,
    Violations,
    check_answers_and_logs,
    check_schedule_ticks,
    client_errors,
    unsettled,
)
from tests.harness.soak_plan import SEED_ENV, period_of
from tests.harness.soak_waits_checks import Submitted, check_store, happenings
from tests.harness.soak_waits_plan import RunPlan
from tests.test_invariant_soak import SERVICE_ENV, Suite, Tally, _call, _service_key, _set_up_projects, _worker_env

REAPER_INTERVAL = 0.5
SCHEDULE_INTERVAL = 0.25
LEASE_TTL = 2.0
SLACK = 3.0
PRODUCERS = 2
DRAIN_SECONDS = 30.0
SERVICES = ("gateway", "saga", "ingest", "scheduler")
PROJECT_LIST = ",".join(p.name for p in wp.PROJECTS)
TOOL_PRINCIPAL = "ws-tool"
# refusals a completion may meet and that are the rules working: the wait had ended (timed out, or
# completed by an earlier post whose answer the test did not wait for), or its run had ended
EXPECTED_REFUSALS = {errors.WAIT_CLOSED, errors.INVALID_TRANSITION}

OPEN_TOKEN_WAITS_SQL = """
SELECT w.run_id::text, w.wait_id::text, extract(epoch FROM now() - w.created_at)::float8 AS age
  FROM awooop_wait w
 WHERE w.status = 'open' AND w.kind = 'token' AND w.step_id = 'approval'
"""
SCHEDULE_TICKS_SQL = "SELECT provider_event_id FROM awooop_run_state WHERE provider_event_id LIKE 'schedule:%'"


@dataclass
class WaitsSuite(Suite):
    """The invariant soak's processes, with this soak's worker and each service's metrics port."""

    metrics: dict[str, int] = field(default_factory=dict)
    tokens: list[Path] = field(default_factory=list)  # where the workers hand out callback URLs

    def callback_urls(self) -> dict[str, str]:
        """run id -> the callback URL its newest attempt handed out."""
        newest: dict[str, tuple[int, str]] = {}
        for path in self.tokens:
            if path.exists():
                for line in path.read_text().splitlines():
                    t = json.loads(line)
                    if t["attempt"] >= newest.get(t["run_id"], (0, ""))[0]:
                        newest[t["run_id"]] = (t["attempt"], t["callback_url"])
        return {run_id: url for run_id, (_, url) in newest.items()}

    async def start_service(self, service: str, extra: dict[str, str]) -> None:
        self.starts[service] += 1
        name = f"{service}-{self.starts[service]}"
        sp = await spawn_services(
            [service],
            self.env | extra,
            self.tmp,
            name,
            fixed=self.ports,
            healthy_within=60,
            metrics_port=self.metrics[service],
        )
        self.services[service] = sp
        self.logs[name] = sp.log_path

    def start_worker(self, i: int) -> None:
        self.starts[f"worker{i}"] += 1
        name = f"worker{i}-{self.starts[f'worker{i}']}"
        errors_path, tokens_path = self.tmp / f"{name}.errors", self.tmp / f"{name}.tokens"
        self.worker_errors.append(errors_path)
        self.tokens.append(tokens_path)
        self.logs[name] = self.tmp / f"{name}.log"
        with open(self.logs[name], "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.soak_waits_worker",
                    name,
                    PROJECT_LIST,
                    str(errors_path),
                    str(tokens_path),
                ],
                env=self.worker_env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        while len(self.workers) <= i:
            self.workers.append(None)
        self.workers[i] = proc


async def _tool_key(dsn: str) -> str:
    """A key of the tool role in each project: what completes the waits by RPC."""
    conn = await asyncpg.connect(dsn)
    try:
        await principals.create_principal(conn, TOOL_PRINCIPAL, "service")
        for p in wp.PROJECTS:
            await principals.grant_role(conn, TOOL_PRINCIPAL, p.name, "tool")
        return (await principals.issue_key(conn, TOOL_PRINCIPAL)).key
    finally:
        await conn.close()


async def test_waits_and_child_runs_hold_through_worker_crashes_with_flow_control_pause_keys_and_schedules(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = wp.make_plan()
    began = time.time()
    phases: dict[str, float] = {}
    monkeypatch.delenv(SEED_ENV, raising=False)  # not a setting of the services it starts
    print(f"\nwaits soak: seed {plan.seed} ({SEED_ENV}={plan.seed} repeats it)")
    dsn = settings.database_url
    internal = await _service_key(dsn, "ws-internal")
    admin_key = await _service_key(dsn, "ws-admin")
    tool_key = await _tool_key(dsn)
    ports = {s: free_port() for s in SERVICES}
    http_port = free_port()
    env = (
        settings_env(settings)
        | SERVICE_ENV
        | {"AWOOOP_INTERNAL_API_KEY": internal, "AWOOOP_WAIT_SWEEP_INTERVAL": "0.2"}
    )
    env.pop("AWOOOP_DATABASE_DIRECT_URL", None)
    suite = WaitsSuite(
        tmp_path,
        env,
        ports,
        worker_env=_worker_env(admin_key, ports, LEASE_TTL),
        metrics={s: free_port() for s in SERVICES},
    )
    http_base = f"http://127.0.0.1:{http_port}"
    extra = {
        "gateway": {},
        "saga": {"AWOOOP_GATEWAY_ADDR": suite.addr("gateway")},
        "ingest": {"AWOOOP_HTTP_PORT": str(http_port)},
        # absolute callback URLs, as a deployment has them
        "scheduler": {"AWOOOP_SAGA_ADDR": suite.addr("saga"), "AWOOOP_WAIT_CALLBACK_BASE_URL": http_base},
    }
    violations, outages, tally, submitted = Violations(), Outages(), Tally(), Submitted()
    completions: collections.Counter[str] = collections.Counter()
    ended: dict[str, int] = {}
    happened: dict[str, int] = {}
    ticks = 0
    worker_seen: collections.Counter[str] = collections.Counter()
    loop_failures: dict[str, float] = {}
    samples, latest_reap, worst = 0, 0.0, {}
    client = Client(key=admin_key, ingest=suite.addr("ingest"), scheduler=suite.addr("scheduler"), timeout=5.0)
    tool = Client(key=tool_key, scheduler=suite.addr("scheduler"), timeout=5.0)
    try:
        await asyncio.gather(*(suite.start_service(s, extra[s]) for s in SERVICES))
        await _set_up_projects(client, tally, wp.PROJECTS)
        for i in range(wp.WORKERS):
            suite.start_worker(i)
        monitor = Monitor(dsn, outages, REAPER_INTERVAL + SLACK, violations)
        monitor.paused_project = wp.PAUSED
        stop_load, stop_completing, stop_monitor = asyncio.Event(), asyncio.Event(), asyncio.Event()
        t0 = time.time()
        phases["set-up"] = t0 - began
        background = [
            asyncio.create_task(monitor.run(stop_monitor)),
            asyncio.create_task(_complete_waits(dsn, suite, tool, submitted, completions, violations, stop_completing)),
        ]
        producers = [
            asyncio.create_task(_produce(client, plan.stream(i), submitted, tally, stop_load)) for i in range(PRODUCERS)
        ]
        background.append(asyncio.create_task(_cancel_parents(client, submitted, tally, stop_completing)))
        kills = asyncio.create_task(_kill_workers(plan, suite, t0))
        await asyncio.sleep(max(0.0, t0 + wp.RESUME_AT - time.time()))  # the timeline's next step, not a wait
        monitor.paused = False
        await _call(client, tally, client.scheduler.ResumeProject, spb.ResumeProjectRequest(project_id=wp.PAUSED))
        await asyncio.sleep(max(0.0, t0 + wp.LOAD_SECONDS - time.time()))  # the load's length
        stop_load.set()
        await asyncio.gather(*producers, kills)
        load_ended = time.time()
        for p in wp.PROJECTS:  # no new ticks while the soak drains and is checked
            for name, _ in p.schedules:
                delete = spb.DeleteScheduleRequest(project_id=p.name, name=name)
                await _call(client, tally, client.scheduler.DeleteSchedule, delete)
        phases["load"] = load_ended - t0

        async def settled() -> bool:
            running, compensating = await unsettled(dsn)
            return running == 0 and compensating == 0

        try:
            await eventually(settled, timeout=DRAIN_SECONDS, interval=0.5, what="every run terminal and compensated")
            phases["drain"] = time.time() - load_ended
        except AssertionError as err:
            violations.add("soak did not settle", str(err))
        stop_completing.set()
        stop_monitor.set()
        await asyncio.gather(*background)
        samples, latest_reap, worst = monitor.samples, monitor.latest_reap, dict(monitor.worst_running)

        loop_failures = await _loop_failures(suite.metrics)
        for what, n in loop_failures.items():
            violations.add("a background loop recorded a failure", f"{what}: {n}")
        ended = await check_store(dsn, submitted, f"service:{TOOL_PRINCIPAL}", violations)
        happened = await happenings(dsn)
        ticks = await _check_schedule(dsn, t0 + 2, load_ended, outages, violations)
        worker_seen = client_errors(suite.worker_errors)
        check_answers_and_logs(worker_seen, tally.seen, suite.read_logs(), violations)
    except BaseException as err:
        err.add_note(f"waits soak seed {plan.seed} (rerun with {SEED_ENV}={plan.seed})")
        raise
    finally:
        await client.close()
        await tool.close()
        suite.stop_all()

    kinds = collections.Counter(p.kind for p in submitted.plans.values())
    print(
        f"waits soak (seed {plan.seed}): {len(submitted.plans)} runs sent ({dict(kinds)}), "
        f"{len(submitted.acked)} acknowledged; ended {ended}; on the way {happened}; completions {dict(completions)}; "
        f"{ticks} schedule ticks; {samples} samples; an expired lease reaped at most {latest_reap:.1f}s late; "
        f"most leased per key {worst}; {len(plan.kills)} worker SIGKILLs; client answers {dict(tally.seen)}; "
        f"workers' failed calls {dict(worker_seen)}; loop failures {loop_failures}; "
        f"seconds { ({k: round(v, 1) for k, v in phases.items()}) }"
    )
    assert not violations.counts, (
        f"waits soak seed {plan.seed} broke (rerun with {SEED_ENV}={plan.seed}):\n{violations.report()}"
    )


async def _produce(
    client: Client, stream: wp.RunStream, submitted: Submitted, tally: Tally, stop: asyncio.Event
) -> None:
    """Sends runs until stopped, each retried until acknowledged."""
    while not stop.is_set():
        p: RunPlan = stream.next_run()
        submitted.plans[p.event_id] = p
        request = ingest_pb2.IngestEventRequest(
            project_id=p.project,
            channel_type=common_pb2.CHANNEL_TYPE_API,
            provider_event_id=p.event_id,
            payload=to_struct(p.input()),
            priority=p.priority,
            concurrency_keys=list(p.keys),
        )
        while not stop.is_set():
            try:
                answer = await client.call(client.ingest.IngestEvent, request)
            except AwooopError as err:
                tally.failed(err)
                await asyncio.sleep(0.2)
                continue
            submitted.acked[p.event_id] = answer.outcomes[0].run_id
            submitted.acked_at[p.event_id] = time.time()
            break
        await asyncio.sleep(stream.pause())


async def _cancel_parents(client: Client, submitted: Submitted, tally: Tally, stop: asyncio.Event) -> None:
    """The operator: each children run whose plan says so is cancelled cancel_after seconds after it
    was acknowledged (while its children run, or before, or after it ended); what CancelRun
    answered is kept for the checks. Until stopped."""
    while not stop.is_set():
        for event_id, run_id in list(submitted.acked.items()):
            plan = submitted.plans[event_id]
            due = submitted.acked_at[event_id] + plan.cancel_after
            if not plan.cancel_after or run_id in submitted.cancels or time.time() < due:
                continue
            request = spb.CancelRunRequest(run_id=run_id, reason="soak: the operator cancels the tree")
            try:
                resp = await client.call(client.scheduler.CancelRun, request)
            except AwooopError as err:
                tally.failed(err)
                if err.reason == errors.INVALID_TRANSITION:
                    submitted.cancels[run_id] = "refused"  # it had ended
                continue  # UNAVAILABLE: again on the next pass
            ended = resp.run.status == common_pb2.RUN_STATUS_CANCELLED
            submitted.cancels[run_id] = "cancelled" if ended else "requested"
        await asyncio.sleep(0.1)


async def _kill_workers(plan: wp.SoakPlan, suite: WaitsSuite, t0: float) -> None:
    """The plan's SIGKILLs at their times (a schedule of faults, not a wait), each worker started
    again after a while."""
    for kill in plan.kills:
        await asyncio.sleep(max(0.0, t0 + kill.at - time.time()))
        suite.kill_worker(kill.worker)
        await asyncio.sleep(kill.down_for)
        suite.start_worker(kill.worker)


async def _complete_waits(
    dsn: str,
    suite: WaitsSuite,
    tool: Client,
    submitted: Submitted,
    completions: collections.Counter[str],
    violations: Violations,
    stop: asyncio.Event,
) -> None:
    """The systems that answer the waits: each open wait of a url / rpc run, once its plan's delay
    has passed, completed with {"verdict", "by"}: POSTed to the callback URL the run's newest attempt
    handed out (every URL an attempt handed out completes the wait: a 404 is a violation), or sent
    with CompleteWait and the tool key. Until stopped."""
    conn = await asyncpg.connect(dsn)
    try:
        async with aiohttp.ClientSession() as http:
            while not stop.is_set():
                plans, urls = submitted.plan_of_run(), suite.callback_urls()
                for r in await conn.fetch(OPEN_TOKEN_WAITS_SQL):
                    plan = plans.get(r["run_id"])
                    if plan is None or plan.kind not in ("url", "rpc") or r["age"] < plan.complete_after:
                        continue
                    body = {"verdict": plan.verdict, "by": plan.kind}
                    url = urls.get(r["run_id"])
                    if plan.kind == "url" and url:
                        async with http.post(url, json=body) as resp:
                            answer = await resp.json(content_type=None)
                        completions[f"url {resp.status}"] += 1
                        if resp.status == 404:
                            violations.add("a handed-out callback URL named no wait", f"{r['run_id']}: {url}")
                        elif resp.status != 200 and answer.get("reason") not in EXPECTED_REFUSALS:
                            violations.add("a callback URL refused a completion", f"{r['run_id']}: {answer}")
                    elif plan.kind == "rpc":
                        request = spb.CompleteWaitRequest(wait_id=r["wait_id"], result=to_struct(body))
                        try:
                            await tool.call(tool.scheduler.CompleteWait, request)
                            completions["rpc OK"] += 1
                        except AwooopError as err:
                            completions[f"rpc {err.code.name}/{err.reason}"] += 1
                            if err.reason not in EXPECTED_REFUSALS and err.code != grpc.StatusCode.UNAVAILABLE:
                                violations.add("CompleteWait refused a tool key's completion", str(err))
                await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def _loop_failures(metrics_ports: dict[str, int]) -> dict[str, float]:
    """Every failure a service process's background loops counted (awooop_loop_errors_total, and
    passes that ended in an error), by `service loop/reason`."""
    found: dict[str, float] = {}
    async with aiohttp.ClientSession() as http:
        for service, port in metrics_ports.items():
            async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                text = await resp.text()
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == "awooop_loop_errors_total" and s.value > 0:
                        found[f"{service} {s.labels['loop']}/{s.labels['reason']}"] = s.value
                    if s.name == "awooop_background_runs_total" and s.labels.get("outcome") == "error" and s.value > 0:
                        found[f"{service} {s.labels['loop']}/failed passes"] = s.value
    return found


async def _check_schedule(dsn: str, started: float, ended: float, outages: Outages, violations: Violations) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(SCHEDULE_TICKS_SQL)
    finally:
        await conn.close()
    fired = 0
    for p in wp.PROJECTS:
        for name, cron in p.schedules:
            ids = [r["provider_event_id"] for r in rows if r["provider_event_id"].split(":", 2)[1] == name]
            grace = SCHEDULE_INTERVAL + SLACK
            fired += check_schedule_ticks(ids, period_of(cron), name, started, ended, outages, grace, violations)
    return fired
