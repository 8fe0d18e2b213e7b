"""The rollout guide (docs/versioning.md) as a test: worker processes of build v1 hold runs parked at
an approval, a callback wait, a durable sleep and a fan-in of child runs, in a pinned project and
an auto-upgrading one, when v2 is rolled out the way the guide says, with a v1 worker killed in
the middle of a step:

1. v2 starts beside v1 (a second Deployment; in the auto-upgrading project a rolling update does
   the same), and registers as the newest build;
2. the pinned project drains v1: new runs go to v2, v1 finishes the runs it started;
3. a v1 pod is SIGKILLed inside a step, another is SIGTERMed (the rolling update): their runs are
   reaped or handed back and finished (the pinned ones by the last v1 pod, the auto-upgrading ones
   by v2);
4. the parked runs are released: the pinned project's finish on v1, the auto-upgrading project's
   on v2, taking the old path of v2's patch (their journals went past it under v1);
5. `awooop builds list` shows no run left on v1 in the pinned project: its last pod is SIGTERMed.

Every step ran once (the step the kill interrupted ran again, with the same idempotency key, and
recorded once)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import Client, to_struct
from services.common.runtime import Runtime
from tests.harness.helpers import ROOT, eventually, key_of
from tests.harness.suite import QUICK, addresses, start_with_gateway

STEADY, ROLLING = "steady", "rolling"  # pinned (the default); auto-upgrade
V1_PODS = ("v1-a", "v1-b", "v1-c")
PATTERNS = ("approval", "callback", "sleep", "children")
DONE = common_pb2.RUN_STATUS_COMPLETED


@dataclass
class World:
    rt: Runtime
    admin: Client
    env: dict[str, str]
    out: Path

    async def create(self, project: str, pattern: str) -> str:
        resp = await self.admin.call(
            self.admin.ingest.IngestEvent,
            ingest_pb2.IngestEventRequest(
                project_id=project,
                channel_type=common_pb2.CHANNEL_TYPE_API,
                provider_event_id=f"evt-{os.urandom(6).hex()}",
                payload=to_struct({}),
                input=to_struct({"pattern": pattern}),
            ),
        )
        return resp.outcomes[0].run_id

    async def run(self, run_id: str) -> common_pb2.Run:
        return (await self.admin.call(self.admin.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id))).run

    def lines(self, name: str) -> list[dict[str, Any]]:
        path = self.out / name
        text = path.read_text() if path.exists() else ""
        return [json.loads(line) for line in text.split("\n")[:-1]]  # a line being written is not read

    def handed(self, run_id: str, kind: str) -> list[Any]:
        return [h["value"] for h in self.lines("handout") if h["run_id"] == run_id and h["kind"] == kind]

    async def builds(self, project: str) -> dict[str, scheduler_pb2.Build]:
        request = scheduler_pb2.ListBuildsRequest(project_id=project)
        return {b.build_id: b for b in (await self.admin.call(self.admin.scheduler.ListBuilds, request)).builds}

    async def children(self, run_id: str) -> list[str]:
        got = await self.admin.call(self.admin.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id))
        return [c.run_id for c in got.children]


@pytest.fixture
async def world(start_services: Any, make_key: Any, tmp_path: Path) -> AsyncIterator[World]:
    _, rt = await start_with_gateway(start_services, **(QUICK | {"build_live_seconds": 3, "wait_sweep_interval": 0.2}))
    worker_key = key_of(await make_key("rollout", {STEADY: ["worker"], ROLLING: ["worker"]}, "service"))
    admin = Client(key=key_of(await make_key("ops", {STEADY: ["admin"], ROLLING: ["admin"]})), **addresses(rt))
    await admin.call(
        admin.scheduler.SetProjectFlow,
        scheduler_pb2.SetProjectFlowRequest(project_id=ROLLING, versioning=common_pb2.VERSIONING_AUTO_UPGRADE),
    )
    a = addresses(rt)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {
        "AWOOOP_API_KEY": worker_key,
        "AWOOOP_SCHEDULER_ADDR": a["scheduler"],
        "AWOOOP_SAGA_ADDR": a["saga"],
    }
    yield World(rt, admin, env, tmp_path)
    await admin.close()


@contextlib.asynccontextmanager
async def pods(w: World) -> AsyncIterator[dict[str, subprocess.Popen[bytes]]]:
    """Worker processes by name, started with pod(); whatever still runs at the end is SIGTERMed."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        yield procs
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(p.wait, 20)
            if p.poll() is None:
                p.kill()
                p.wait()


def pod(w: World, procs: dict[str, subprocess.Popen[bytes]], name: str, build: str) -> None:
    with open(w.out / f"{name}.log", "ab") as log:
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "tests.rollout_worker", str(w.out), STEADY, ROLLING],
            env=w.env | {"AWOOOP_WORKER_BUILD": build},
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )


async def sigterm(p: subprocess.Popen[bytes]) -> int:
    p.send_signal(signal.SIGTERM)
    return await asyncio.to_thread(p.wait, 30)


async def test_a_rollout_from_v1_to_v2_as_the_guide_does_it(world: World) -> None:
    w = world
    async with pods(w) as procs:
        for name in V1_PODS:
            pod(w, procs, name, "v1")
        runs = {
            (project, pattern): await w.create(project, pattern)
            for project in (STEADY, ROLLING)
            for pattern in PATTERNS
        }
        slow = {project: await w.create(project, "slow") for project in (STEADY, ROLLING)}

        async def parked() -> bool:
            for (_, pattern), run_id in runs.items():
                run = await w.run(run_id)
                if run.status not in (common_pb2.RUN_STATUS_WAITING_APPROVAL, common_pb2.RUN_STATUS_WAITING_TOOL):
                    return False
                if run.worker_id:  # leased: not parked yet
                    return False
                if pattern == "children" and len(await w.children(run_id)) < 2:
                    return False
            kids = [k for (p, pat), r in runs.items() if pat == "children" for k in await w.children(r)]
            return all(w.handed(k, "approval") for k in kids) and all(w.handed(r, "inside") for r in slow.values())

        await eventually(parked, timeout=60, what="every run parked under v1, the slow ones inside their step")
        for run_id in [*runs.values(), *slow.values()]:
            assert (await w.run(run_id)).build_id == "v1"

        # 1. v2 starts beside v1 and is the newest build of both projects
        pod(w, procs, "v2-a", "v2")

        async def v2_newest() -> bool:
            for p in (STEADY, ROLLING):
                b = (await w.builds(p)).get("v2")
                if b is None or not (b.newest and b.live):
                    return False
            return True

        await eventually(v2_newest, timeout=30, what="v2 registered")

        # 2. the pinned project drains v1: a new run goes to v2
        await w.admin.call(
            w.admin.scheduler.DrainBuild,
            scheduler_pb2.DrainBuildRequest(project_id=STEADY, build_id="v1", reason="rolling out v2"),
        )
        fresh = await w.create(STEADY, "approval")
        await eventually(lambda: _has(w.handed(fresh, "approval")), timeout=30, what="the new run parked")
        assert (await w.run(fresh)).build_id == "v2"

        # 3. the v1 pod inside the pinned project's slow step is killed; the step is let go on
        killed_pid = w.handed(slow[STEADY], "inside")[0]
        killed = next(name for name, p in procs.items() if p.pid == killed_pid)
        procs[killed].kill()
        procs[killed].wait()
        # the rolling update's SIGTERM of another v1 pod: it hands back what it holds (an
        # auto-upgrading run then resumes on v2); one v1 pod stays for the pinned project's runs
        rolled, last = (name for name in V1_PODS if name != killed)
        assert await sigterm(procs[rolled]) == 0
        (w.out / "go").touch()
        for project, run_id in slow.items():
            await eventually(lambda r=run_id: _status(w, r, DONE), timeout=60, what=f"the slow run of {project}")
        assert (await w.run(slow[STEADY])).output["finished_on"] == "v1"  # pinned: the other v1 pod
        # 4. the parked runs are let go: approvals approved, waits completed, sleeps ended
        await release(w, [*runs.values(), fresh])
        for (project, pattern), run_id in runs.items():
            await eventually(lambda r=run_id: _status(w, r, DONE), timeout=60, what=f"{project} {pattern} done")
        await eventually(lambda: _status(w, fresh, DONE), timeout=60, what="the new run done")

        for (project, pattern), run_id in runs.items():
            output = (await w.run(run_id)).output
            if project == STEADY:
                assert output["finished_on"] == "v1", (pattern, output)
            else:  # resumed on the newest build; its journal went past the patch under v1: the old path
                assert output["finished_on"] == "v2" and output["notified"] is False, (pattern, output)
        assert (await w.run(fresh)).output["finished_on"] == "v2"
        assert (await w.run(fresh)).output["notified"] is True

        # 5. nothing is left on v1 in the pinned project: its last pod goes
        steady = await w.builds(STEADY)
        v1 = steady["v1"]
        assert (v1.queued, v1.held, v1.leased, v1.parked) == (0, 0, 0, 0) and v1.draining
        assert await sigterm(procs[last]) == 0
        assert await sigterm(procs["v2-a"]) == 0

    steps = Counter((s["run_id"], s["step"]) for s in w.lines("steps"))
    assert all(n == 1 for n in steps.values()), [k for k, n in steps.items() if n > 1]
    for run_id in [*runs.values(), *slow.values(), fresh]:
        assert steps[(run_id, "prepare")] == 1 and steps[(run_id, "finish")] == 1, run_id
    # v2's patch: the new run; and the auto-upgrading slow run if it was killed inside its step (a
    # step journaled after it ran leaves nothing behind: its journal never went past the patch)
    notified = {r for r, s in steps if s == "notify"}
    assert notified - {slow[ROLLING]} == {fresh}, notified


async def release(w: World, run_ids: list[str]) -> None:
    """The outside world: approves every handed-out approval (the children's too), completes the
    callback waits, ends the sleeps by hand (ExpireWait)."""
    kids = [k for r in run_ids for k in await w.children(r)]
    for run_id in [*run_ids, *kids]:
        for token in w.handed(run_id, "approval")[-1:]:
            await w.admin.call(
                w.admin.scheduler.DecideApproval,
                scheduler_pb2.DecideApprovalRequest(
                    run_id=run_id, approval_token=token, decision=scheduler_pb2.DECISION_APPROVE
                ),
            )
        waits = await w.admin.call(w.admin.scheduler.ListWaits, scheduler_pb2.ListWaitsRequest(run_id=run_id))
        for wait in waits.waits:
            if wait.status != scheduler_pb2.WAIT_STATUS_OPEN:
                continue
            if wait.kind == scheduler_pb2.WAIT_KIND_TOKEN:
                request = scheduler_pb2.CompleteWaitRequest(wait_id=wait.wait_id, result=to_struct({"ok": True}))
                await w.admin.call(w.admin.scheduler.CompleteWait, request)
            elif wait.kind == scheduler_pb2.WAIT_KIND_SLEEP:
                await w.admin.call(w.admin.scheduler.ExpireWait, scheduler_pb2.ExpireWaitRequest(wait_id=wait.wait_id))


def _has(v: Any) -> Any:
    async def f() -> bool:
        return bool(v)

    return f()


async def _status(w: World, run_id: str, status: int) -> bool:
    return (await w.run(run_id)).status == status
