"""The background loops where features meet: several projects with their own flow settings, a
paused project, concurrency keys and a schedule, with the loops running on their own timers (not
called by the test), so a pass that fails shows up as work that never happens."""

from __future__ import annotations

import uuid
from typing import Any

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from tests.harness.flow import serve
from tests.harness.helpers import eventually
from tests.harness.scheduler import dur, expire_lease
from tests.test_flow_control import policy


async def test_the_reaper_reaps_every_project_by_its_own_policy_while_several_have_flow_settings(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    f = await serve(start_services, channels, db, make_key, reaper_interval=0.2, retry_backoff=5.0)
    ops = await make_key("ops", {"p": ["admin", "ingest", "worker"], "q": ["admin"], "r": ["admin", "ingest"]})
    for project, initial in (("p", 100), ("q", 200)):
        flow = pb.SetProjectFlowRequest(
            project_id=project, retry_policy=policy(initial=initial, multiplier=1, max=1000), weight=2
        )
        await f.sched.SetProjectFlow(flow, metadata=ops)
    await f.sched.SetConcurrencyLimit(
        pb.SetConcurrencyLimitRequest(project_id="p", key="deploy", max_running=1), metadata=ops
    )
    # r: no flow settings, paused after its run was claimed (a paused project's leases still expire)
    runs = {
        "p": await f.create("p-run", concurrency_keys=["deploy"]),
        "q": await f.create("q-run", project="q"),
    }
    waiting_on_key = await f.create("p-next", concurrency_keys=["deploy"])
    r_worker = await make_key("r-worker", {"r": ["worker", "ingest"]}, "service")
    create_r = ingest_pb2.CreateRunRequest(project_id="r", idempotency_key="r-run")
    runs["r"] = (await f.ingest.CreateRun(create_r, metadata=r_worker)).run
    claimed = await f.claim(["p", "q"], max_runs=10)
    claimed += list(
        (await f.sched.ClaimRuns(pb.ClaimRunsRequest(worker_id="w", project_ids=["r"]), metadata=r_worker)).runs
    )
    assert {c.run.run_id for c in claimed} == {r.run_id for r in runs.values()}  # p-next waits for the key
    await f.sched.PauseProject(pb.PauseProjectRequest(project_id="r", reason="maintenance"), metadata=ops)

    # every worker crashed: their leases lapse, and the reaper's own loop must take them all back
    for run in runs.values():
        await expire_lease(db, run.run_id)

    async def all_reaped() -> bool:
        n = await db.fetchval(
            "SELECT count(*) FROM awooop_run_state WHERE run_id = ANY($1::uuid[]) AND status = 'PENDING'"
            " AND reaped_at IS NOT NULL",
            [uuid.UUID(r.run_id) for r in runs.values()],
        )
        return bool(n == len(runs))

    await eventually(all_reaped, timeout=20, what="the reaper loop to requeue every project's expired lease")
    for project, backoff in (("p", 100.0), ("q", 200.0), ("r", 5.0)):
        row = await db.fetchrow(
            "SELECT extract(epoch FROM not_before - reaped_at)::float8 AS backoff, wait_reason, worker_id"
            " FROM awooop_run_state WHERE run_id = $1",
            uuid.UUID(runs[project].run_id),
        )
        assert row is not None
        assert (round(row["backoff"], 3), row["wait_reason"], row["worker_id"]) == (backoff, "backoff", None), project
    # the reaped run gave its key's slot back: the next run with the key is claimable at once
    (c,) = await f.claim(["p"], wait=dur(5))
    assert c.run.run_id == waiting_on_key.run_id
    assert c.run.status == common_pb2.RUN_STATUS_RUNNING
