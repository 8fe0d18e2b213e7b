"""Worker labels and affinity against real services (docs/flow-control.md, "Worker labels"): runs
that require labels go only to workers that have them, beside priorities, a concurrency key,
several projects and a paused one; a run no live worker can take waits visibly (why-waiting, the
gauge, the CLI) and is woken when one comes; preferred labels wait a bounded time; a run resumed
after an approval sticks to its worker while that worker is live; a SIGKILLed labelled worker's
run comes back and waits for another; bad labels are refused with the field named; a retried
claim of a labelled worker answers what the first one claimed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf import duration_pb2
from prometheus_client import REGISTRY

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import AwooopError, Child, Client, RunContext, Worker, to_struct
from services.common.runtime import Runtime
from tests.harness.helpers import ROOT, eventually, key_of
from tests.harness.suite import QUICK, addresses, start_with_gateway, stop_worker

LAB, OTHER, PAUSED = "lab", "other", "paused"
PROJECTS = [LAB, OTHER, PAUSED]
GPU = {"gpu": "a100"}
SETTINGS = QUICK | {
    "worker_live_seconds": 1.5,  # a worker gone this long no longer counts
    "label_sweep_interval": 0.2,
    "prefer_wait_seconds": 8.0,
    "queue_metrics_interval": 0.3,
    "lease_ttl": 3.0,
}


@dataclass
class Env:
    rt: Runtime
    worker_key: str
    admin: Client
    db: Any
    ran: dict[str, list[str]] = field(default_factory=dict)  # run id -> the workers that ran its handler
    tokens: dict[str, str] = field(default_factory=dict)  # run id -> its approval token
    children: dict[str, list[str]] = field(default_factory=dict)  # a fan-out run's id -> its children's
    hold: asyncio.Event = field(default_factory=asyncio.Event)  # a "hold" run's handler waits for it

    def worker(self, name: str, labels: dict[str, str] | None = None, **kw: Any) -> Worker:
        kw.setdefault("heartbeat_interval", 0.2)
        kw.setdefault("claim_wait", 1)
        return Worker(
            self.handler(name),
            projects=PROJECTS,
            key=self.worker_key,
            worker_id=name,
            labels=labels or {},
            scheduler=addresses(self.rt)["scheduler"],
            saga=addresses(self.rt)["saga"],
            **kw,
        )

    def handler(self, name: str) -> Callable[[RunContext], Awaitable[Any]]:
        async def handle(ctx: RunContext) -> dict[str, Any] | None:
            self.ran.setdefault(ctx.run_id, []).append(name)
            what = ctx.input.get("do")
            if what == "hold":
                await self.hold.wait()
            elif what == "fanout":  # three children that need a GPU, whoever runs the parent
                outcomes = await ctx.run_children([Child(input={"child": i}, required_labels=GPU) for i in range(3)])
                assert all(o.ok for o in outcomes), outcomes
                self.children[ctx.run_id] = [o.run_id for o in outcomes]
            elif what == "approve":
                approval = await ctx.request_approval("go?", ttl=600)
                if not approval.granted:
                    self.tokens[ctx.run_id] = approval.token
                    return None
            else:
                await asyncio.sleep(0.05)
            return {"on": name}

        return handle

    async def create(
        self, project: str, *, do: str = "", priority: int = 0, keys: tuple[str, ...] = (), **labels: Any
    ) -> str:
        resp = await self.admin.call(
            self.admin.ingest.IngestEvent,
            ingest_pb2.IngestEventRequest(
                project_id=project,
                channel_type=common_pb2.CHANNEL_TYPE_API,
                provider_event_id=f"evt-{uuid.uuid4().hex}",
                payload=to_struct({"do": do}),
                priority=priority,
                concurrency_keys=keys,
                **labels,
            ),
        )
        return resp.outcomes[0].run_id

    async def run(self, run_id: str) -> common_pb2.Run:
        return (await self.admin.call(self.admin.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id))).run

    async def done(self, run_id: str) -> bool:
        return (await self.run(run_id)).status == common_pb2.RUN_STATUS_COMPLETED

    async def claimed_after(self, run_id: str) -> float:
        """Seconds from the run's last becoming ready (created or approved) to its last claim."""
        return float(
            await self.db.fetchval(
                """SELECT EXTRACT(EPOCH FROM max(created_at) FILTER (WHERE kind = 'CLAIMED')
                                        - max(created_at) FILTER (WHERE kind IN ('RUN_CREATED', 'APPROVED')))
                     FROM awooop_run_event WHERE run_id = $1""",
                uuid.UUID(run_id),
            )
        )

    async def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {"AWOOOP_API_KEY": self.admin.key}
        a = addresses(self.rt)
        cmd = [sys.executable, "-m", "awooop.cli", *args, "--scheduler", a["scheduler"], "--saga", a["saga"]]
        return await asyncio.to_thread(subprocess.run, cmd, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
async def env(start_services: Any, make_key: Any, db: Any) -> AsyncIterator[Env]:
    _, rt = await start_with_gateway(start_services, **SETTINGS)
    worker_key = key_of(await make_key("labelled", {p: ["worker"] for p in PROJECTS}, "service"))
    admin = Client(key=key_of(await make_key("ops", {p: ["admin"] for p in PROJECTS})), **addresses(rt))
    yield Env(rt, worker_key, admin, db)
    await admin.close()


async def _running(w: Worker) -> asyncio.Task[None]:
    return asyncio.create_task(w.run(install_signal_handlers=False))


async def _claims(w: Worker, n: int = 2) -> None:
    """The worker made n more claims: each passed over what it may not take."""
    start = w.stats.claims_sent

    async def more() -> bool:
        return w.stats.claims_sent >= start + n

    await eventually(more, timeout=30, what=f"{n} more claims of {w.worker_id}")


async def test_required_labels_route_beside_priorities_a_key_projects_a_pause_and_a_missing_label(env: Env) -> None:
    """Labelled and plain runs in two projects and a paused one, with priorities and a
        concurrency key of limit 1, and a parent whose children need the label: every labelled run runs
    once, on the worker that has the label;
        the paused project's waits for its resume; a run requiring a label no worker has waits
        visibly (GetRun, the gauge, the CLI) and runs once a worker with it comes."""
    admin = env.admin
    await admin.call(
        admin.scheduler.SetConcurrencyLimit,
        scheduler_pb2.SetConcurrencyLimitRequest(project_id=LAB, key="gpu-slot", max_running=1),
    )
    await admin.call(admin.scheduler.PauseProject, scheduler_pb2.PauseProjectRequest(project_id=PAUSED, reason="t"))
    gpu_runs = [await env.create(LAB, priority=p, required_labels=GPU) for p in (5, 0, -5)]
    keyed = [await env.create(LAB, keys=("gpu-slot",), required_labels=GPU) for _ in range(3)]
    gpu_runs += keyed + [await env.create(OTHER, required_labels=GPU | {"region": "eu"}) for _ in range(3)]
    plain = [await env.create(p) for p in (LAB, OTHER) for _ in range(4)]
    plain.append(await env.create(OTHER, do="fanout"))
    preferring = [await env.create(LAB, preferred_labels={"region": "nowhere"})]  # no such worker: no wait
    paused = await env.create(PAUSED, required_labels=GPU)
    missing = await env.create(LAB, required_labels={"gpu": "h100"})

    gpu, cpu = env.worker("gpu-1", GPU | {"region": "eu"}, concurrency=2), env.worker("cpu-1", concurrency=4)
    tasks = [await _running(gpu), await _running(cpu)]
    for r in gpu_runs + plain + preferring:
        await eventually(lambda r=r: env.done(r), timeout=60, what=f"run {r} done")
    for r in gpu_runs:
        assert env.ran[r] == ["gpu-1"], (r, env.ran[r])
    for r in plain + preferring:
        assert len(env.ran[r]) == 1 or r in env.children, (r, env.ran[r])  # a parent runs again when they end
    (kids,) = env.children.values()
    for kid in kids:
        assert env.ran[kid] == ["gpu-1"] and (await env.run(kid)).required_labels == GPU

    # the run nobody can take: parked by the sweep, counted, worded
    async def parked() -> bool:
        return (await env.run(missing)).wait_reason == "labels"

    await eventually(parked, timeout=30, what="the h100 run parked for its labels")
    assert missing not in env.ran and paused not in env.ran

    async def counted() -> bool:
        value = REGISTRY.get_sample_value("awooop_scheduler_runs_waiting_for_labels", {"project": LAB})
        return value == 1

    await eventually(counted, timeout=30, what="the gauge counting the parked run")
    shown = await env.cli("runs", "show", missing)
    assert "no live worker has the labels it requires (gpu=h100)" in shown.stdout, shown.stdout
    assert "requires labels" in shown.stdout and "gpu=h100" in shown.stdout
    listed = await env.cli("workers", "list", "--project", LAB, "--json")
    workers = {w["worker_id"]: w for w in json.loads(listed.stdout)["workers"]}
    assert workers["gpu-1"]["labels"] == {"gpu": "a100", "region": "eu"} and workers["gpu-1"]["live"]
    assert workers["cpu-1"].get("labels", {}) == {} and workers["cpu-1"]["live"]

    # a worker with the label comes: the parked run is woken and runs there; the pause lifts
    h100 = env.worker("gpu-h100", {"gpu": "h100"})
    tasks.append(await _running(h100))
    await eventually(lambda: env.done(missing), timeout=30, what="the h100 run done on the h100 worker")
    assert env.ran[missing] == ["gpu-h100"]
    await _claims(gpu)
    assert paused not in env.ran
    await admin.call(admin.scheduler.ResumeProject, scheduler_pb2.ResumeProjectRequest(project_id=PAUSED))
    await eventually(lambda: env.done(paused), timeout=30, what="the paused project's run done after resume")
    assert env.ran[paused] == ["gpu-1"]
    for w, t in zip((gpu, cpu, h100), tasks, strict=True):
        await stop_worker(w, t)


async def test_preferred_labels_wait_a_bounded_time_for_a_matching_worker_only_while_one_is_live(env: Env) -> None:
    """A run preferring region=eu goes to the free eu worker; while the eu worker is busy it waits
    AWOOOP_PREFER_WAIT_SECONDS, then the other worker takes it; with no eu worker live it does not
    wait at all."""
    eu, us = env.worker("eu-1", {"region": "eu"}, concurrency=1), env.worker("us-1", {"region": "us"}, concurrency=2)
    tasks = [await _running(eu), await _running(us)]
    await _claims(eu, 1)
    first = await env.create(LAB, preferred_labels={"region": "eu"})
    await eventually(lambda: env.done(first), timeout=30, what="the preferring run done")
    assert env.ran[first] == ["eu-1"]

    busy = await env.create(LAB, do="hold", required_labels={"region": "eu"})
    await eventually(lambda: asyncio.sleep(0, busy in env.ran), timeout=30, what="the eu worker busy")
    waiting = await env.create(LAB, preferred_labels={"region": "eu"})
    await _claims(us, 2)
    assert waiting not in env.ran, "taken by a worker without the preferred labels inside the window"
    await eventually(lambda: env.done(waiting), timeout=60, what="taken after the preference window")
    assert env.ran[waiting] == ["us-1"]
    assert await env.claimed_after(waiting) >= SETTINGS["prefer_wait_seconds"] - 0.5
    env.hold.set()
    await eventually(lambda: env.done(busy), timeout=30, what="the held run done")

    await stop_worker(eu, tasks[0])

    async def eu_gone() -> bool:
        listed = await env.admin.call(env.admin.scheduler.ListWorkers, scheduler_pb2.ListWorkersRequest(project_id=LAB))
        return not next(w for w in listed.workers if w.worker_id == "eu-1").live

    await eventually(eu_gone, timeout=30, what="the eu worker no longer live")
    alone = await env.create(LAB, preferred_labels={"region": "eu"})
    await eventually(lambda: env.done(alone), timeout=30, what="taken at once: no eu worker is live")
    assert env.ran[alone] == ["us-1"]
    assert await env.claimed_after(alone) < SETTINGS["prefer_wait_seconds"]
    await stop_worker(us, tasks[1])


async def test_a_run_resumed_after_an_approval_sticks_to_its_worker_while_that_worker_is_live(env: Env) -> None:
    """In a project with sticky resume (60 s), two plain workers: a run parked at an approval
    resumes on the worker that parked it (the other keeps claiming and passes it over); parked
    again and that worker stopped, it resumes on the other as soon as the first is no longer live,
    long before the sticky window ends. In a project without it, a parked run names no worker."""
    flow = scheduler_pb2.SetProjectFlowRequest(project_id=LAB, sticky_resume_seconds=60)  # longer than any wait
    await env.admin.call(env.admin.scheduler.SetProjectFlow, flow)
    shown = await env.cli("flow", "show", "--project", LAB)
    assert "sticky resume    60 s" in shown.stdout, shown.stdout
    a, b = env.worker("w-a"), env.worker("w-b")
    tasks = {"w-a": await _running(a), "w-b": await _running(b)}
    by_name = {"w-a": a, "w-b": b}
    for round_ in range(2):
        run_id = await env.create(LAB, do="approve")

        async def parked(run_id: str = run_id) -> bool:
            return (await env.run(run_id)).status == common_pb2.RUN_STATUS_WAITING_APPROVAL

        await eventually(parked, timeout=30, what="the run parked at its approval")
        first = env.ran[run_id][0]
        other = "w-b" if first == "w-a" else "w-a"
        run = await env.run(run_id)
        assert run.sticky_worker == first
        shown = await env.cli("runs", "show", run_id)
        assert "resumes on" in shown.stdout and first in shown.stdout, shown.stdout
        if round_ == 1:  # the worker it sticks to goes away
            await stop_worker(by_name[first], tasks.pop(first))
        await env.admin.call(
            env.admin.scheduler.DecideApproval,
            scheduler_pb2.DecideApprovalRequest(
                run_id=run_id, approval_token=env.tokens[run_id], decision=scheduler_pb2.DECISION_APPROVE
            ),
        )
        if round_ == 0:
            await _claims(by_name[other], 3)
            assert other not in env.ran[run_id], "the other worker took a run sticking to a live worker"
        await eventually(lambda r=run_id: asyncio.sleep(0, len(env.ran[r]) == 2), timeout=30, what="resumed")
        assert env.ran[run_id][1] == (first if round_ == 0 else other), env.ran[run_id]
        assert not (await env.run(run_id)).sticky_worker  # the claim clears it
    other_project = await env.create(OTHER, do="approve")
    await eventually(lambda: asyncio.sleep(0, other_project in env.tokens), timeout=30, what="parked in OTHER")
    assert not (await env.run(other_project)).sticky_worker  # sticky resume is off there
    for name, t in tasks.items():
        await stop_worker(by_name[name], t)


async def test_a_sigkilled_labelled_worker_loses_its_run_to_the_next_worker_with_the_label(env: Env) -> None:
    """A real worker process with gpu=a100 claims the labelled run and is SIGKILLed: the lease
    expires, the run is queued again, parked while no live worker has the label, and runs once
    on the next gpu worker."""
    run_id = await env.create(LAB, required_labels=GPU)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "tests" / "worker_proc.py"),
        addresses(env.rt)["scheduler"],
        env.worker_key,
        LAB,
        "doomed-gpu",
        "0.2",
        "gpu=a100",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        claimed = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))  # type: ignore[union-attr]
        assert claimed["run_id"] == run_id
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()

    async def parked_for_labels() -> bool:
        run = await env.run(run_id)
        return run.status == common_pb2.RUN_STATUS_PENDING and run.wait_reason == "labels"

    await eventually(parked_for_labels, timeout=30, what="reaped, then parked: no live gpu worker")
    gpu = env.worker("gpu-2", GPU)
    task = await _running(gpu)
    await eventually(lambda: env.done(run_id), timeout=30, what="done on the next gpu worker")
    assert env.ran[run_id] == ["gpu-2"]
    await stop_worker(gpu, task)


async def test_bad_labels_are_refused_with_the_field_named_and_the_http_channel_takes_labels(env: Env) -> None:
    worker = Client(key=env.worker_key, **addresses(env.rt))
    try:
        for labels, field_name in (({"bad key!": "x"}, "labels['bad key!']"), ({"k": "no spaces"}, "labels['k']")):
            with pytest.raises(AwooopError) as err:
                await worker.call(
                    worker.scheduler.ClaimRuns,
                    scheduler_pb2.ClaimRunsRequest(worker_id="w", project_ids=[LAB], labels=labels),
                )
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and field_name in str(err.value), err.value
        too_many = {f"k{i}": "v" for i in range(17)}
        with pytest.raises(AwooopError) as err:
            await env.create(LAB, required_labels=too_many)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "required_labels" in str(err.value)
        # nothing was lost: the labelled worker still claims the project's runs
        ok = await env.create(LAB, required_labels=GPU)
        got = await worker.call(
            worker.scheduler.ClaimRuns,
            scheduler_pb2.ClaimRunsRequest(
                worker_id="w", project_ids=[LAB], labels=GPU, claim_id="c1", wait=duration_pb2.Duration(seconds=5)
            ),
        )
        assert [r.lease.run_id for r in got.runs] == [ok]
        # the answer was lost: the retry with the same claim id answers the same run, claims no other
        await env.create(LAB, required_labels=GPU)
        again = await worker.call(
            worker.scheduler.ClaimRuns,
            scheduler_pb2.ClaimRunsRequest(worker_id="w", project_ids=[LAB], labels=GPU, claim_id="c1"),
        )
        assert [r.lease.run_id for r in again.runs] == [ok]
        assert (await env.run(ok)).required_labels == GPU
    finally:
        await worker.close()

    url = f"http://127.0.0.1:{env.rt.http_ports['ingest']}/v1/projects/{LAB}/events"
    headers = {"Authorization": f"Bearer {env.admin.key}", "Idempotency-Key": uuid.uuid4().hex}
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "?require_label=gpu", json={"x": 1}, headers=headers) as resp:
            assert resp.status == 400, await resp.text()
            assert "require_label" in await resp.text()
        headers["Idempotency-Key"] = uuid.uuid4().hex
        async with http.post(url + "?require_label=gpu=a100&prefer_label=region=eu", json={}, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            body = await resp.json()
    run = await env.run(body["outcomes"][0]["run_id"])
    assert run.required_labels == GPU and run.preferred_labels == {"region": "eu"}


async def test_concurrent_claims_and_label_sweeps_claim_every_run_once_on_a_worker_with_its_labels(env: Env) -> None:
    """Eight claimers (four labelled gpu=a100) claim 300 runs (half require the label) while the
    label sweep runs again and again, parking the labelled runs whenever the gpu workers' last
    sighting is older than its tiny liveness window and waking them when one is seen again: every
    run is claimed exactly once, each labelled one by a labelled claimer, and none is left parked.
    The claimers start with the labelled runs parked a second time (parked, woken by a sighting,
    parked again once the sighting is older than the window), so park, wake and park again have
    happened whatever the interleaving that follows."""
    from services.common.db import create_pool
    from services.scheduler import claiming, workers, workers_sql

    assert env.rt.ctx is not None
    pool = await create_pool(env.rt.ctx.settings.with_(db_pool_max=12))
    await env.db.execute(
        """INSERT INTO awooop_run_state (project_id, channel_type, input, required_labels, created_at)
           SELECT 'race', 'api', '{}', CASE WHEN g % 2 = 0 THEN '{"gpu": "a100"}'::jsonb END,
                  now() - interval '1 minute' + g * interval '1 ms'
             FROM generate_series(1, 300) g"""
    )
    gpu = workers.Routing(labels_json='{"gpu": "a100"}', live_secs=60.0)
    plain = workers.Routing(live_secs=60.0)
    claimed: list[tuple[str, str, bool]] = []  # (run id, claimer, whether the run requires the label)
    done = asyncio.Event()

    async def claimer(name: str, routing: workers.Routing) -> None:
        idle = 0
        while idle < 40:  # 40 empty claims in a row (2 s): nothing left for it
            rows = await claiming.claim(pool, ["race"], 5, 60.0, name, "test", routing)
            if routing is gpu and not rows:
                # seen again: its labels are news to nobody here, so wake explicitly, as a new scheduler would
                await workers_sql.worker_seen(
                    pool,
                    projects=["race"],
                    worker_id=name,
                    labels=gpu.labels_json,
                    build_id="",
                    wake=True,
                    max_workers=workers.MAX_WORKERS,
                )
            claimed.extend((str(r["run_id"]), name, r["required_labels"] is not None) for r in rows)
            idle = 0 if rows else idle + 1
            await asyncio.sleep(0 if rows else 0.05)

    async def sweep() -> int:
        row = await workers_sql.sweep_labels(pool, project_id=None, live_secs=0.02, forget_secs=86400.0)
        assert row is not None
        return int(row["parked"])

    async def sweeper() -> None:
        while not done.is_set():  # a liveness window of 20 ms: most passes find no gpu worker live
            await sweep()
            await asyncio.sleep(0.01)

    sweeping: asyncio.Task[None] | None = None
    try:
        assert await sweep() == 150
        await workers_sql.worker_seen(
            pool,
            projects=["race"],
            worker_id="gpu-0",
            labels=gpu.labels_json,
            build_id="",
            wake=True,
            max_workers=workers.MAX_WORKERS,
        )
        assert await env.db.fetchval("SELECT count(*) FROM awooop_run_state WHERE wait_reason = 'labels'") == 0
        await asyncio.sleep(0.05)  # the sighting is older than the sweep's liveness window (20 ms)
        assert await sweep() == 150
        sweeping = asyncio.create_task(sweeper())
        await asyncio.gather(
            *(claimer(f"gpu-{i}", gpu) for i in range(4)), *(claimer(f"cpu-{i}", plain) for i in range(4))
        )
    finally:
        done.set()
        if sweeping is not None:
            await sweeping
        await pool.close()
    ids = [r for r, _, _ in claimed]
    assert len(ids) == len(set(ids)) == 300, (len(ids), len(set(ids)))
    assert all(name.startswith("gpu-") for _, name, labelled in claimed if labelled)
    counts = await env.db.fetchrow(
        """SELECT count(*) FILTER (WHERE status = 'RUNNING' AND attempt_count = 1) AS once,
                  count(*) FILTER (WHERE wait_reason = 'labels') AS parked
             FROM awooop_run_state WHERE project_id = 'race'"""
    )
    assert counts["once"] == 300 and counts["parked"] == 0, dict(counts)
    history = await env.db.fetchval(
        "SELECT count(*) FROM awooop_run_event WHERE project_id = 'race' AND kind = 'CLAIMED'"
    )
    assert history == 300
