"""Versioned workers against real services (docs/versioning.md): workers declare a build, a claim
records it on the run, and a run whose journal holds steps resumes on its own build while pinned
or on the project's newest build when it auto-upgrades; several projects with different routing,
per-run overrides, a run with no journal, draining, moving a run by hand, and the runs that wait
for a build that is gone (ListBuilds, the queue gauges), in one test each."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import AwooopError, Client, RunContext, Worker, to_struct
from services.common.runtime import Runtime
from tests.harness.helpers import eventually, key_of
from tests.harness.suite import QUICK, addresses, start_with_gateway, stop_worker

PIN, AUTO = "pin", "auto"  # a project left pinned (the default), one set to auto-upgrade
APPROVE = scheduler_pb2.DECISION_APPROVE


@dataclass
class Env:
    rt: Runtime
    worker_key: str
    admin: Client
    db: Any
    tokens: dict[str, str] = field(default_factory=dict)  # run id -> approval token
    ran: list[tuple[str, str, str]] = field(default_factory=list)  # (build, run id, step) of each step fn call

    def worker(self, build: str, handler: Callable[[RunContext], Awaitable[Any]] | None = None, **kw: Any) -> Worker:
        a = addresses(self.rt)
        kw.setdefault("heartbeat_interval", 0.2)
        kw.setdefault("claim_wait", 1)
        return Worker(
            handler or self.handler,
            projects=[PIN, AUTO],
            key=self.worker_key,
            scheduler=a["scheduler"],
            saga=a["saga"],
            build_id=build,
            worker_id=f"w-{build}-{uuid.uuid4().hex[:6]}",
            **kw,
        )

    async def handler(self, ctx: RunContext) -> dict[str, Any] | None:
        """One step, an approval, one more step: the same code in every build of these tests."""

        def step(name: str) -> Callable[[Any], dict[str, Any]]:
            def run(call: Any) -> dict[str, Any]:
                self.ran.append((ctx.build_id, ctx.run_id, name))
                return {"build": ctx.build_id}

            return run

        await ctx.step("prepare", step("prepare"))
        approval = await ctx.request_approval("go?", ttl=600)
        if not approval.granted:
            self.tokens[ctx.run_id] = approval.token
            return None
        await ctx.step("apply", step("apply"))
        return {"finished_on": ctx.build_id}

    async def create(self, project: str, versioning: int = common_pb2.VERSIONING_UNSPECIFIED) -> str:
        resp = await self.admin.call(
            self.admin.ingest.IngestEvent,
            ingest_pb2.IngestEventRequest(
                project_id=project,
                channel_type=common_pb2.CHANNEL_TYPE_API,
                provider_event_id=f"evt-{os.urandom(6).hex()}",
                payload=to_struct({}),
                versioning=versioning,
            ),
        )
        return resp.outcomes[0].run_id

    async def run(self, run_id: str) -> common_pb2.Run:
        return (await self.admin.call(self.admin.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id))).run

    async def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`python -m awooop.cli ...` against these services with the admin key."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {"AWOOOP_API_KEY": self.admin.key}
        a = addresses(self.rt)
        cmd = [sys.executable, "-m", "awooop.cli", *args, "--scheduler", a["scheduler"], "--saga", a["saga"]]
        return await asyncio.to_thread(subprocess.run, cmd, env=env, capture_output=True, text=True, timeout=60)

    async def approve(self, run_id: str, token: str | None = None) -> None:
        await self.admin.call(
            self.admin.scheduler.DecideApproval,
            scheduler_pb2.DecideApprovalRequest(
                run_id=run_id, approval_token=token or self.tokens[run_id], decision=APPROVE
            ),
        )

    async def builds(self, project: str) -> dict[str, scheduler_pb2.Build]:
        resp = await self.admin.call(
            self.admin.scheduler.ListBuilds, scheduler_pb2.ListBuildsRequest(project_id=project)
        )
        return {b.build_id: b for b in resp.builds}

    async def status_is(self, run_id: str, status: int) -> bool:
        return (await self.run(run_id)).status == status


@pytest.fixture
async def env(start_services: Any, make_key: Any, db: Any) -> AsyncIterator[Env]:
    _, rt = await start_with_gateway(start_services, **(QUICK | {"build_live_seconds": 1.5}))
    worker_key = key_of(await make_key("versioned", {PIN: ["worker"], AUTO: ["worker"]}, "service"))
    admin = Client(key=key_of(await make_key("ops", {PIN: ["admin"], AUTO: ["admin"]})), **addresses(rt))
    await admin.call(
        admin.scheduler.SetProjectFlow,
        scheduler_pb2.SetProjectFlowRequest(project_id=AUTO, versioning=common_pb2.VERSIONING_AUTO_UPGRADE),
    )
    yield Env(rt, worker_key, admin, db)
    await admin.close()


async def _running(w: Worker) -> asyncio.Task[None]:
    return asyncio.create_task(w.run(install_signal_handlers=False))


def _true(v: bool) -> Any:
    async def f() -> bool:
        return v

    return f()


async def _claims_pass(w: Worker, n: int = 2) -> None:
    """The worker made n more claims (each one passed over what it may not take)."""
    start = w.stats.claims_sent
    await eventually(lambda: _true(w.stats.claims_sent >= start + n), timeout=30, what=f"{n} more claims")


async def test_pinned_runs_wait_for_their_build_and_auto_upgrading_ones_resume_on_the_newest(env: Env) -> None:
    """Four runs park at an approval under v1: in the pinned project one of its own and one that
    auto-upgrades; in the auto-upgrade project one of its own and one pinned. v1 goes away, v2
    comes, the four are approved: the two that auto-upgrade finish on v2, the two pinned ones wait
    for v1 (counted, never failed). One is moved to v2 by hand and finishes there; v1 comes back
    and finishes the other. Every step ran once."""
    pinned = await env.create(PIN)
    upgrading = await env.create(PIN, common_pb2.VERSIONING_AUTO_UPGRADE)
    auto = await env.create(AUTO)
    auto_pinned = await env.create(AUTO, common_pb2.VERSIONING_PINNED)
    runs = [pinned, upgrading, auto, auto_pinned]
    v1 = env.worker("v1", concurrency=4)
    task = await _running(v1)
    await eventually(lambda: _true(len(env.tokens) == 4), timeout=30, what="four approvals requested")
    await stop_worker(v1, task)
    for r in runs:
        run = await env.run(r)
        assert run.build_id == "v1" and run.status == common_pb2.RUN_STATUS_WAITING_APPROVAL
    assert (await env.run(upgrading)).versioning == common_pb2.VERSIONING_AUTO_UPGRADE
    assert (await env.run(pinned)).versioning == common_pb2.VERSIONING_UNSPECIFIED

    v2 = env.worker("v2", concurrency=4)
    task = await _running(v2)
    await eventually(lambda: _true(v2.stats.claims_sent > 0), what="v2 claiming")  # v2 registered: the newest
    for r in runs:
        await env.approve(r)
    for r in (upgrading, auto):
        await eventually(lambda r=r: env.status_is(r, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="done")
        assert (await env.run(r)).output["finished_on"] == "v2"
    await _claims_pass(v2)
    for r in (pinned, auto_pinned):
        run = await env.run(r)
        assert run.status == common_pb2.RUN_STATUS_RESUMED and run.build_id == "v1" and run.attempt_count == 1

    async def waiting_for_v1() -> bool:
        pin, auto_builds = await env.builds(PIN), await env.builds(AUTO)
        return pin["v1"].waiting_for_build == 1 and auto_builds["v1"].waiting_for_build == 1

    await eventually(waiting_for_v1, timeout=30, what="v1 not live: its runs counted as waiting for it")
    got = await env.admin.call(env.admin.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=pinned))
    assert got.waiting_for_build
    shown = await env.cli("runs", "show", pinned)
    assert "pinned to build v1, which no live worker runs: it waits for one" in shown.stdout, shown.stdout
    history = await env.admin.call(env.admin.scheduler.GetRunHistory, scheduler_pb2.GetRunHistoryRequest(run_id=pinned))
    claimed = [e for e in history.events if e.action == "CLAIMED"]
    assert claimed and all(e.details["build_id"] == "v1" for e in claimed)
    pin = await env.builds(PIN)
    assert not pin["v1"].live and pin["v2"].live and pin["v2"].newest and not pin["v1"].newest
    assert pin["v1"].queued == 1 and pin["v2"].queued == 0

    moved = await env.admin.call(
        env.admin.scheduler.SetRunBuild,
        scheduler_pb2.SetRunBuildRequest(run_id=pinned, build_id="v2", reason="v2 replays it"),
    )
    assert moved.run.build_id == "v2"
    await eventually(lambda: env.status_is(pinned, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="moved, done")
    assert (await env.run(pinned)).output["finished_on"] == "v2"
    history = await env.admin.call(env.admin.scheduler.GetRunHistory, scheduler_pb2.GetRunHistoryRequest(run_id=pinned))
    assert [e.action for e in history.events].count("BUILD_SET") == 1

    v1 = env.worker("v1")
    task_v1 = await _running(v1)
    await eventually(lambda: env.status_is(auto_pinned, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="v1 back")
    await stop_worker(v1, task_v1)
    await stop_worker(v2, task)
    assert (await env.run(auto_pinned)).output["finished_on"] == "v1"
    for r in runs:  # "prepare" once on v1, "apply" once where the run finished
        assert [s for b, rr, s in env.ran if rr == r] == ["prepare", "apply"], env.ran
        assert next(b for b, rr, s in env.ran if rr == r) == "v1"


async def test_a_run_without_journal_goes_to_any_build_and_a_draining_build_takes_only_its_own(env: Env) -> None:
    """A run claimed by v0 and handed back before any step goes to any build. With v1 draining and
    v2 running, new runs all go to v2, and a pinned run of v1 still goes to v1; an auto-upgrading
    run on v2 never goes back to the older v1."""
    # v1 parks one pinned run at an approval; then v1 drains
    pinned = await env.create(PIN)
    v1 = env.worker("v1")
    t1 = await _running(v1)
    await eventually(lambda: _true(pinned in env.tokens), timeout=30, what="the pinned run parked")
    drained = await env.admin.call(
        env.admin.scheduler.DrainBuild,
        scheduler_pb2.DrainBuildRequest(project_id=PIN, build_id="v1", reason="v2 rolls out"),
    )
    assert drained.build.draining and drained.build.drained_by
    await env.admin.call(
        env.admin.scheduler.DrainBuild, scheduler_pb2.DrainBuildRequest(project_id=AUTO, build_id="v1")
    )
    # a run on v0 (no worker of it), handed back before any step: no journal ties it to v0
    rpc = Client(key=env.worker_key, scheduler=addresses(env.rt)["scheduler"])
    fresh = await env.create(PIN)
    claim = await rpc.call(
        rpc.scheduler.ClaimRuns,
        scheduler_pb2.ClaimRunsRequest(worker_id="by-hand", project_ids=[PIN], max_runs=1, build_id="v0"),
    )
    assert [(c.run.run_id, c.run.build_id) for c in claim.runs] == [(fresh, "v0")]
    await rpc.call(rpc.scheduler.ReleaseRun, scheduler_pb2.ReleaseRunRequest(lease=claim.runs[0].lease))
    await rpc.close()
    await _claims_pass(v1)  # v1 drains: it does not take it
    assert (await env.run(fresh)).status == common_pb2.RUN_STATUS_PENDING
    v2 = env.worker("v2")
    t2 = await _running(v2)
    await eventually(lambda: _true(fresh in env.tokens), timeout=30, what="the fresh run parked")
    assert (await env.run(fresh)).build_id == "v2"
    news = [await env.create(project) for project in (PIN, AUTO, PIN, AUTO)]
    await eventually(lambda: _true(all(n in env.tokens for n in news)), timeout=30, what="new runs parked")
    assert [(await env.run(n)).build_id for n in news] == ["v2"] * 4
    await env.approve(pinned)
    await eventually(lambda: env.status_is(pinned, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="v1 ends its own")
    assert (await env.run(pinned)).output["finished_on"] == "v1"

    # an auto-upgrading run on v2 with only v1 live (v2 stopped; v1 undrained): it waits for v2
    await stop_worker(v2, t2)
    await env.admin.call(
        env.admin.scheduler.DrainBuild, scheduler_pb2.DrainBuildRequest(project_id=AUTO, build_id="v1", undrain=True)
    )
    auto_run = news[1]
    await env.approve(auto_run)
    await _claims_pass(v1, 3)
    assert (await env.run(auto_run)).status == common_pb2.RUN_STATUS_RESUMED
    await stop_worker(v1, t1)
    listed = await env.admin.call(
        env.admin.scheduler.ListRuns, scheduler_pb2.ListRunsRequest(project_id=PIN, build_id="v1")
    )
    assert {r.run_id for r in listed.runs} == {pinned}


async def test_bad_build_ids_and_moves_are_refused_with_their_field_or_status(env: Env) -> None:
    rpc = Client(key=env.worker_key, scheduler=addresses(env.rt)["scheduler"])
    with pytest.raises(AwooopError) as bad:
        await rpc.call(
            rpc.scheduler.ClaimRuns,
            scheduler_pb2.ClaimRunsRequest(worker_id="w", project_ids=[PIN], max_runs=1, build_id="has space"),
        )
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT and bad.value.details.violations[0][0] == "build_id"
    run_id = await env.create(PIN)
    claim = await rpc.call(
        rpc.scheduler.ClaimRuns, scheduler_pb2.ClaimRunsRequest(worker_id="w", project_ids=[PIN], max_runs=1)
    )
    assert claim.runs[0].run.build_id == ""  # a worker that declares no build leaves none
    with pytest.raises(AwooopError) as leased:  # a run a worker holds is not moved under it
        await env.admin.call(
            env.admin.scheduler.SetRunBuild, scheduler_pb2.SetRunBuildRequest(run_id=run_id, build_id="v9")
        )
    assert leased.value.code == grpc.StatusCode.FAILED_PRECONDITION and leased.value.reason == "INVALID_TRANSITION"
    with pytest.raises(AwooopError) as forbidden:  # the worker role may not move runs
        await rpc.call(rpc.scheduler.SetRunBuild, scheduler_pb2.SetRunBuildRequest(run_id=run_id, build_id="v9"))
    assert forbidden.value.code == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(AwooopError) as versioning:
        await env.admin.call(
            env.admin.scheduler.SetProjectFlow, scheduler_pb2.SetProjectFlowRequest(project_id=PIN, versioning=7)
        )
    assert versioning.value.details.violations[0][0] == "versioning"
    flow = await env.admin.call(
        env.admin.scheduler.SetProjectFlow, scheduler_pb2.SetProjectFlowRequest(project_id=AUTO, weight=2)
    )
    assert flow.flow.versioning == common_pb2.VERSIONING_AUTO_UPGRADE  # unset: kept
    await rpc.close()


async def test_a_patch_keeps_runs_in_flight_on_the_old_path_and_sends_new_runs_down_the_new_one(env: Env) -> None:
    """v1 parks a run at an approval. v2 adds a step behind ctx.patched("extra-check") before the
    approval, and a second approval after it. The run v1 started takes the old path (its journal
    went past the patch), a run v2 starts takes the new one, each on every attempt; ListPatches
    and `awooop builds patches` count them while they are unfinished."""
    await env.admin.call(
        env.admin.scheduler.SetProjectFlow,
        scheduler_pb2.SetProjectFlowRequest(project_id=PIN, versioning=common_pb2.VERSIONING_AUTO_UPGRADE),
    )
    answers: dict[str, list[bool]] = {}

    async def v2(ctx: RunContext) -> dict[str, Any] | None:
        await ctx.step("prepare", lambda call: env.ran.append((ctx.build_id, ctx.run_id, "prepare")) or {})
        new = await ctx.patched("extra-check")
        answers.setdefault(ctx.run_id, []).append(new)
        if new:
            await ctx.step("check", lambda call: env.ran.append((ctx.build_id, ctx.run_id, "check")) or {})
        for step_id in ("approval", "second"):
            approval = await ctx.request_approval("go?", step_id=step_id, ttl=600)
            if not approval.granted:
                env.tokens[ctx.run_id] = approval.token
                return None
        return {"new": new}

    old = await env.create(PIN)
    v1 = env.worker("v1")
    t1 = await _running(v1)
    await eventually(lambda: _true(old in env.tokens), timeout=30, what="v1 parked the old run")
    await stop_worker(v1, t1)
    w2 = env.worker("v2", v2, concurrency=2)
    t2 = await _running(w2)
    new = await env.create(PIN)
    await eventually(lambda: _true(new in env.tokens), timeout=30, what="v2 parked the new run")
    for r in (old, new):  # the first approval's tokens: the second approval's replace them
        await env.approve(r, env.tokens.pop(r))
    await eventually(lambda: _true(old in env.tokens and new in env.tokens), timeout=30, what="both at the second")
    patches = await env.admin.call(env.admin.scheduler.ListPatches, scheduler_pb2.ListPatchesRequest(project_id=PIN))
    assert [(p.change_id, p.patched, p.unpatched) for p in patches.patches] == [("extra-check", 1, 1)]
    out = await env.cli("builds", "patches", "--project", PIN)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[1].split() == ["extra-check", "1", "1", "no"], out.stdout
    for r in (old, new):
        await env.approve(r)
    for r in (old, new):
        await eventually(lambda r=r: env.status_is(r, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="done")
    await stop_worker(w2, t2)
    assert answers[old] == [False, False] and answers[new] == [True, True, True]
    assert (await env.run(old)).output["new"] is False and (await env.run(new)).output["new"] is True
    assert [s for _, r, s in env.ran if r == new].count("check") == 1
    assert "check" not in [s for _, r, s in env.ran if r == old]
    patches = await env.admin.call(env.admin.scheduler.ListPatches, scheduler_pb2.ListPatchesRequest(project_id=PIN))
    assert list(patches.patches) == []  # no unfinished run needs the old path: it may be deleted
    out = await env.cli("builds", "list", "--project", PIN)
    assert out.returncode == 0 and "v2" in out.stdout and "newest" in out.stdout, out.stdout


async def test_builds_with_a_paused_project_and_a_full_concurrency_key(env: Env) -> None:
    """Routing by build beside the other claim rules: in the pinned project two runs share a key
    limited to 1 (the second waits key_busy until the first leaves its lease at its approval); the
    auto-upgrading project is paused (nothing of it is claimed) and resumed. Every run goes to v2,
    the one live build."""
    await env.admin.call(
        env.admin.scheduler.SetConcurrencyLimit,
        scheduler_pb2.SetConcurrencyLimitRequest(project_id=PIN, key="deploy", max_running=1),
    )
    await env.admin.call(env.admin.scheduler.PauseProject, scheduler_pb2.PauseProjectRequest(project_id=AUTO))
    keyed = []
    for _ in range(2):
        resp = await env.admin.call(
            env.admin.ingest.IngestEvent,
            ingest_pb2.IngestEventRequest(
                project_id=PIN,
                channel_type=common_pb2.CHANNEL_TYPE_API,
                provider_event_id=f"evt-{os.urandom(6).hex()}",
                payload=to_struct({}),
                concurrency_keys=["deploy"],
            ),
        )
        keyed.append(resp.outcomes[0].run_id)
    paused = await env.create(AUTO)
    v2 = env.worker("v2", concurrency=4)
    task = await _running(v2)
    await eventually(lambda: _true(all(r in env.tokens for r in keyed)), timeout=30, what="both keyed runs parked")
    await _claims_pass(v2)
    assert (await env.run(paused)).status == common_pb2.RUN_STATUS_PENDING  # paused: not claimed
    await env.admin.call(env.admin.scheduler.ResumeProject, scheduler_pb2.ResumeProjectRequest(project_id=AUTO))
    await eventually(lambda: _true(paused in env.tokens), timeout=30, what="the resumed project's run parked")
    await stop_worker(v2, task)
    history = await env.admin.call(
        env.admin.scheduler.GetRunHistory, scheduler_pb2.GetRunHistoryRequest(run_id=keyed[1])
    )
    assert [(await env.run(r)).build_id for r in [*keyed, paused]] == ["v2"] * 3
    assert len([e for e in history.events if e.action == "CLAIMED"]) == 1  # claimed once, after the key freed
