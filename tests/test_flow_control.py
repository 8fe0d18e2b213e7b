"""Flow control against the real services and store: retry policy (per run, per project, from
settings; FailRun and reaped leases), delayed runs, priorities and fairness across projects."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from collections import Counter
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common import retry_policy
from services.scheduler import queue_sql, reaper
from services.scheduler.saga_client import SagaNudger
from tests.harness.flow import LeasedPerKey, serve
from tests.harness.helpers import eventually, expect_error, settings_env, spawn_services
from tests.harness.scheduler import dur, expire_lease, run_row


def policy(**kw: Any) -> common_pb2.RetryPolicy:
    p = common_pb2.RetryPolicy(
        multiplier=kw.pop("multiplier", 0.0),
        jitter=kw.pop("jitter", 0.0),
        max_attempts=kw.pop("max_attempts", 0),
        non_retryable_error_codes=kw.pop("codes", []),
    )
    if "initial" in kw:
        p.initial_backoff.CopyFrom(dur(kw.pop("initial")))
    if "max" in kw:
        p.max_backoff.CopyFrom(dur(kw.pop("max")))
    assert not kw, kw
    return p


def at(seconds_from_now: float) -> Timestamp:
    t = Timestamp()
    t.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds_from_now))
    return t


# --- retry policy ----------------------------------------------------------------------------


async def test_a_runs_retry_policy_grows_the_backoff_caps_it_and_ends_at_max_attempts(
    start_services, channels, db, make_key
) -> None:
    f = await serve(start_services, channels, db, make_key)
    run = await f.create("grow", retry_policy=policy(initial=10, multiplier=3, max=50, max_attempts=4))
    assert run.max_attempts == 4  # the run's policy gives it its attempts
    delays = []
    for attempt in range(1, 4):
        (c,) = await f.claim()
        assert c.lease.attempt == attempt
        failed = await f.fail(c)
        assert failed.status == common_pb2.RUN_STATUS_PENDING and failed.wait_reason == "backoff"
        assert failed.not_before.ToDatetime() > failed.updated_at.ToDatetime()
        delays.append(round(await f.delay_of(run.run_id), 3))
        # nothing is claimable during the backoff
        assert await f.claim() == []
        await f.make_ready(run.run_id)
    assert delays == [10.0, 30.0, 50.0]  # 10, 10*3, min(50, 10*9)
    (c,) = await f.claim()
    assert (await f.fail(c)).status == common_pb2.RUN_STATUS_FAILED  # the 4th attempt was the last

    # GetRun shows when and why while it waits
    run2 = await f.create("shown", retry_policy=policy(initial=100))
    (c,) = await f.claim()
    await f.fail(c)
    got = (await f.sched.GetRun(pb.GetRunRequest(run_id=run2.run_id), metadata=f.worker)).run
    assert got.wait_reason == "backoff" and got.not_before.seconds > 0
    # retry_after still wins over the policy
    await f.make_ready(run2.run_id)
    (c,) = await f.claim()
    await f.fail(c, retry_after=dur(2.5))
    assert round(await f.delay_of(run2.run_id), 3) == 2.5


async def test_project_defaults_and_non_retryable_codes_fail_at_once(start_services, channels, db, make_key) -> None:
    f = await serve(start_services, channels, db, make_key, retry_backoff=3.0, retry_multiplier=2.0)
    # before any project setting: the service's
    got = (await f.sched.GetProjectFlow(pb.GetProjectFlowRequest(project_id="p"), metadata=f.worker)).flow
    assert got.weight == 1 and got.effective_retry_policy.initial_backoff.seconds == 3
    assert got.effective_retry_policy.max_attempts == 3

    await expect_error(
        f.sched.SetProjectFlow(pb.SetProjectFlowRequest(project_id="p"), metadata=f.outsider),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    err = await expect_error(
        f.sched.SetProjectFlow(
            pb.SetProjectFlowRequest(project_id="p", retry_policy=policy(multiplier=50)), metadata=f.admin
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "retry_policy.multiplier" in (err.details() or "")

    flow = pb.SetProjectFlowRequest(
        project_id="p", retry_policy=policy(initial=7, max_attempts=5, codes=["E-BAD-INPUT"]), weight=2
    )
    stored = (await f.sched.SetProjectFlow(flow, metadata=f.admin)).flow
    assert stored.weight == 2 and list(stored.retry_policy.non_retryable_error_codes) == ["E-BAD-INPUT"]
    assert stored.effective_retry_policy.multiplier == 2.0  # unset: the service's
    audit = await db.fetchrow("SELECT actor, details FROM awooop_audit_log WHERE action = 'PROJECT_FLOW_SET'")
    assert audit is not None and json.loads(audit["details"])["weight"] == 2

    # a run created without max_attempts gets the project's; IngestEvent and CreateRun alike
    ev = await f.ingest.IngestEvent(
        ingest_pb2.IngestEventRequest(
            project_id="p", channel_type=common_pb2.CHANNEL_TYPE_API, provider_event_id="e1", payload=None
        ),
        metadata=f.creator,
    )
    event_run = await run_row(db, ev.outcomes[0].run_id)
    assert event_run["max_attempts"] == 5
    other = await f.create("q-run", project="q")
    assert other.max_attempts == 3  # q has no settings: the service's

    # a named non-retryable code fails at once, although the worker said retryable
    (c,) = await f.claim()
    failed = await f.fail(c, error_code="E-BAD-INPUT")
    assert failed.status == common_pb2.RUN_STATUS_FAILED and failed.wait_reason == ""
    # another code follows the project's backoff (7 s), the run's own policy may override it
    run = await f.create("own", retry_policy=policy(multiplier=4))
    (c,) = await f.claim()
    assert (await f.fail(c, error_code="E-TRANSIENT")).status == common_pb2.RUN_STATUS_PENDING
    assert round(await f.delay_of(run.run_id), 3) == 7.0
    await f.make_ready(run.run_id)
    (c,) = await f.claim()
    await f.fail(c, error_code="E-TRANSIENT")
    assert round(await f.delay_of(run.run_id), 3) == 28.0  # 7 * 4 (the run's multiplier)
    # retryable=false fails at once
    await f.make_ready(run.run_id)
    (c,) = await f.claim()
    assert (await f.fail(c, retryable=False)).status == common_pb2.RUN_STATUS_FAILED


async def test_a_reaped_lease_backs_off_like_a_failure(start_services, channels, db, make_key) -> None:
    f = await serve(start_services, channels, db, make_key)
    run = await f.create("crashy", retry_policy=policy(initial=20, multiplier=2, max=1000, max_attempts=3))
    defaults = json.dumps(retry_policy.defaults(f.rt.ctx.settings))  # type: ignore[union-attr]
    saga = SagaNudger(f.rt.ctx.settings)  # type: ignore[union-attr]
    expected = [20.0, 40.0]
    for attempt in (1, 2):
        (c,) = await f.claim()
        assert c.lease.attempt == attempt
        await expire_lease(db, run.run_id)
        assert (await reaper.reap(f.rt.ctx.pool, saga, policy_defaults=defaults)).requeued == 1  # type: ignore[union-attr]
        row = await run_row(db, run.run_id)
        assert row["status"] == "PENDING" and row["wait_reason"] == "backoff"
        assert round((row["not_before"] - row["reaped_at"]).total_seconds(), 3) == expected[attempt - 1]
        assert await f.claim() == []  # a crash loop waits too
        await f.make_ready(run.run_id)
    (c,) = await f.claim()
    await expire_lease(db, run.run_id)
    assert (await reaper.reap(f.rt.ctx.pool, saga, policy_defaults=defaults)).failed == 1  # type: ignore[union-attr]


async def test_bad_flow_fields_are_invalid_argument(start_services, channels, db, make_key) -> None:
    f = await serve(start_services, channels, db, make_key)
    for fields, name in (
        ({"priority": 5000}, "priority"),
        ({"not_before": at(400 * 86400)}, "not_before"),
        ({"retry_policy": policy(jitter=2.0)}, "retry_policy.jitter"),
        ({"retry_policy": policy(max_attempts=101)}, "retry_policy.max_attempts"),
        ({"not_before": Timestamp(seconds=1, nanos=-404)}, "not_before"),
        ({"concurrency_key": "has space"}, "concurrency_key"),
    ):
        err = await expect_error(f.create(f"bad-{name}", **fields), grpc.StatusCode.INVALID_ARGUMENT)
        assert name in (err.details() or ""), (name, err.details())


# --- delayed runs ------------------------------------------------------------------------------


async def test_a_delayed_run_is_claimed_from_not_before_by_a_waiting_worker(
    start_services, channels, db, make_key
) -> None:
    f = await serve(start_services, channels, db, make_key)
    # the worker is already waiting when the delayed run arrives; it is woken at not_before
    waiting = asyncio.ensure_future(f.claim(wait=dur(20)))
    await asyncio.sleep(0)  # the claim is sent; the assertion below does not depend on it being first
    run = await f.create("later", not_before=at(1.5))
    assert run.wait_reason == "delayed" and run.status == common_pb2.RUN_STATUS_PENDING
    assert await f.claim() == []  # not claimable yet
    (c,) = await asyncio.wait_for(waiting, 30)
    assert c.run.run_id == run.run_id
    claimed_at = await db.fetchval(
        "SELECT created_at FROM awooop_audit_log WHERE run_id = $1 AND action = 'CLAIMED'", uuid.UUID(run.run_id)
    )
    assert claimed_at >= run.not_before.ToDatetime(tzinfo=dt.UTC)

    # IngestEvent takes not_before too
    resp = await f.ingest.IngestEvent(
        ingest_pb2.IngestEventRequest(
            project_id="p",
            channel_type=common_pb2.CHANNEL_TYPE_API,
            provider_event_id="later-event",
            not_before=at(3600),
        ),
        metadata=f.creator,
    )
    row = await run_row(db, resp.outcomes[0].run_id)
    assert row["wait_reason"] == "delayed" and row["not_before"] > dt.datetime.now(dt.UTC)
    assert await f.claim() == []


# --- priorities and fairness ----------------------------------------------------------------------


async def test_higher_priority_first_then_the_earliest_due(start_services, channels, db, make_key) -> None:
    f = await serve(start_services, channels, db, make_key)
    ids = {}
    for name, prio in (("low-old", -1), ("mid-old", 0), ("high", 5), ("mid-new", 0), ("high-new", 5)):
        ids[(await f.create(name, priority=prio)).run_id] = name
    order = [ids[c.run.run_id] for c in await f.claim(max_runs=10)]
    assert order == ["high", "high-new", "mid-old", "mid-new", "low-old"]
    singly = []
    for name, prio in (("a", 0), ("b", 1), ("c", 0)):
        ids[(await f.create("s-" + name, priority=prio)).run_id] = name
    for _ in range(3):
        (c,) = await f.claim()
        singly.append(ids[c.run.run_id])
    assert singly == ["b", "a", "c"]


async def _backlog(db: asyncpg.Connection, project: str, n: int) -> None:
    await db.execute(
        """INSERT INTO awooop_run_state (project_id, channel_type, input, created_at)
           SELECT $1, 'api', '{}', now() - interval '1 hour' + g * interval '1 millisecond'
             FROM generate_series(1, $2) g""",
        project,
        n,
    )


async def test_a_backlog_in_one_project_does_not_starve_another(start_services, channels, db, make_key) -> None:
    f = await serve(start_services, channels, db, make_key)
    await _backlog(db, "p", 2000)  # older than everything in q
    await db.execute(
        "INSERT INTO awooop_run_state (project_id, channel_type, input)"
        " SELECT 'q', 'api', '{}' FROM generate_series(1, 10)"
    )
    got: Counter[str] = Counter()
    for _ in range(60):  # each claim gives q a run with probability 1/2 while it has one
        (c,) = await f.claim(["p", "q"])
        got[c.run.project_id] += 1
        if got["q"] == 10:
            break
    # oldest-first across projects would have given q nothing; P(fewer than 10 of 60) < 1e-7
    assert got["q"] == 10, got


async def test_weights_share_a_batch_claim(start_services, channels, db, make_key) -> None:
    f = await serve(start_services, channels, db, make_key)
    await make_key("root-q", {"q": ["admin"]})
    await _backlog(db, "p", 500)
    await _backlog(db, "q", 500)
    await db.execute("INSERT INTO awooop_project_flow (project_id, weight) VALUES ('q', 3)")
    total: Counter[str] = Counter()
    for _ in range(5):
        for c in await f.claim(["p", "q"], max_runs=20):
            total[c.run.project_id] += 1
    # q's share is 3/4 of 100 (interleaved by weight; only each batch's head is random)
    assert total["p"] + total["q"] == 100
    assert 62 <= total["q"] <= 92, total


# --- concurrency keys ------------------------------------------------------------------------------


async def test_a_full_key_parks_runs_and_a_freed_slot_wakes_a_waiting_worker(
    start_services, channels, db, make_key
) -> None:
    f = await serve(start_services, channels, db, make_key)
    set_limit = pb.SetConcurrencyLimitRequest(project_id="p", key="k8s:deployment/api", max_running=1)
    await expect_error(f.sched.SetConcurrencyLimit(set_limit, metadata=f.outsider), grpc.StatusCode.PERMISSION_DENIED)
    limit = (await f.sched.SetConcurrencyLimit(set_limit, metadata=f.admin)).limit
    assert (limit.max_running, limit.running) == (1, 0)
    first = await f.create("one", concurrency_key="k8s:deployment/api")
    second = await f.create("two", concurrency_key="k8s:deployment/api")
    free = await f.create("free")
    got = await f.claim(max_runs=3)
    assert {c.run.run_id for c in got} == {first.run_id, free.run_id}  # mutual exclusion on the key
    parked = (await f.sched.GetRun(pb.GetRunRequest(run_id=second.run_id), metadata=f.worker)).run
    assert parked.status == common_pb2.RUN_STATUS_PENDING and parked.wait_reason == "key_busy"
    listed = await f.sched.ListConcurrencyLimits(pb.ListConcurrencyLimitsRequest(project_id="p"), metadata=f.worker)
    assert [(x.key, x.running, x.waiting) for x in listed.limits] == [("k8s:deployment/api", 1, 1)]

    waiting = asyncio.ensure_future(f.claim(wait=dur(20)))
    holder = next(c for c in got if c.run.run_id == first.run_id)
    await f.sched.CompleteRun(pb.CompleteRunRequest(lease=holder.lease), metadata=f.worker)
    (c,) = await asyncio.wait_for(waiting, 30)  # woken by the freed slot, not by a poll
    assert c.run.run_id == second.run_id and c.run.wait_reason == ""
    # removing the limit makes the key unlimited
    third = await f.create("three", concurrency_key="k8s:deployment/api")
    assert await f.claim() == []
    await f.sched.SetConcurrencyLimit(
        pb.SetConcurrencyLimitRequest(project_id="p", key="k8s:deployment/api", max_running=0), metadata=f.admin
    )
    (c,) = await f.claim()
    assert c.run.run_id == third.run_id


async def test_ten_claimers_on_two_scheduler_processes_never_exceed_a_keys_limit(
    settings, tmp_path, channels, db, db_dsn, make_key
) -> None:
    limits = {"llm:provider-x": 2, "k8s:deployment/api": 1}
    procs = [
        await spawn_services(["scheduler"], {**settings_env(settings), "AWOOOP_RETRY_JITTER": "0"}, tmp_path, f"s{i}")
        for i in range(2)
    ]
    try:
        worker = await make_key("worker", {"p": ["worker"]}, "service")
        admin = await make_key("root", {"p": ["admin"]})
        stubs = [scheduler_pb2_grpc.SchedulerServiceStub(channels(sp.ports["scheduler"])) for sp in procs]
        for key, n in limits.items():
            await stubs[0].SetConcurrencyLimit(
                pb.SetConcurrencyLimitRequest(project_id="p", key=key, max_running=n), metadata=admin
            )
        # a rate key: at most 4 starts per second
        await stubs[1].SetConcurrencyLimit(
            pb.SetConcurrencyLimitRequest(project_id="p", key="llm:rated", max_starts=4, per=dur(1.0)), metadata=admin
        )
        await db.execute(
            """INSERT INTO awooop_run_state (project_id, channel_type, input, concurrency_keys, created_at)
               SELECT 'p', 'api', '{}', CASE WHEN g % 6 < 3 THEN '{llm:provider-x}'::text[]
                                             WHEN g % 6 = 3 THEN '{k8s:deployment/api}'
                                             WHEN g % 6 = 4 THEN '{llm:rated}' END,
                      clock_timestamp()
                 FROM generate_series(1, 72) g"""
        )
        await db.execute("SELECT pg_notify('awooop_run_ready', 'p')")
        done = asyncio.Event()
        leased = LeasedPerKey(db_dsn, done)
        worst = leased.worst

        async def claimer(i: int) -> None:
            stub = stubs[i % 2]
            while not done.is_set():
                resp = await stub.ClaimRuns(
                    pb.ClaimRunsRequest(worker_id=f"w{i}", project_ids=["p"], max_runs=2, wait=dur(1)),
                    metadata=worker,
                )
                for c in resp.runs:
                    await asyncio.sleep(0.01)  # the handler's work, so leases overlap
                    await stub.CompleteRun(pb.CompleteRunRequest(lease=c.lease), metadata=worker)

        async def all_completed() -> bool:
            return not await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE status <> 'COMPLETED'")

        async def all_done() -> None:
            await eventually(all_completed, timeout=90, what="every run to complete")
            done.set()

        tasks = [asyncio.ensure_future(claimer(i)) for i in range(10)] + [asyncio.ensure_future(leased.run())]
        try:
            await asyncio.wait_for(all_done(), 90)  # every parked run was woken as keys freed
        finally:
            done.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:
            assert t.exception() is None, t.exception()
        assert all(worst[k] <= n for k, n in limits.items()), worst
        assert worst["llm:provider-x"] == 2, worst  # the limit was reached, so the test could fail
        rows = await db.fetch("SELECT key, running FROM awooop_concurrency_limit")
        assert {r["key"]: r["running"] for r in rows} == {**{k: 0 for k in limits}, "llm:rated": 0}
        starts = [
            r["created_at"]
            for r in await db.fetch(
                """SELECT a.created_at FROM awooop_audit_log a JOIN awooop_run_state r USING (run_id)
                WHERE a.action = 'CLAIMED' AND r.concurrency_keys = '{llm:rated}' ORDER BY a.created_at"""
            )
        ]
        # 12 starts at 4 per window need 3 fixed windows, each opened at least a second after the
        # one before (CLAIMED rows carry their transaction's start, up to a lock wait earlier)
        assert len(starts) == 12 and (starts[-1] - starts[0]).total_seconds() >= 1.9, starts
    finally:
        for sp in procs:
            sp.terminate()


# --- pause, resume, redrive ----------------------------------------------------------------------------


async def test_a_paused_project_is_skipped_its_leases_finish_and_resume_wakes_waiting_workers(
    start_services, channels, db, make_key
) -> None:
    f = await serve(start_services, channels, db, make_key)
    running = await f.create("running")
    (held,) = await f.claim()
    await expect_error(
        f.sched.PauseProject(pb.PauseProjectRequest(project_id="p"), metadata=f.outsider),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    paused = await f.sched.PauseProject(pb.PauseProjectRequest(project_id="p", reason="bad deploy"), metadata=f.admin)
    assert paused.flow.paused
    queued = await f.create("queued")
    other = await f.create("other", project="q")
    # nor is it counted as claimable: the queue gauges and CountRuns skip it as the claim does
    counts = await f.sched.CountRuns(pb.CountRunsRequest(project_id="p"), metadata=f.admin)
    assert not counts.HasField("oldest_claimable_created_at") and counts.claimable == 0
    sampled = {(r["project_id"], r["status"]): r["claimable"] for r in await db.fetch(queue_sql.SAMPLE_QUEUE.sql)}
    assert sampled[("p", "PENDING")] == 0 and sampled[("q", "PENDING")] == 1
    assert await f.claim() == []  # skipped, alone ...
    (c,) = await f.claim(["p", "q"], max_runs=5)  # ... or beside another project
    assert c.run.run_id == other.run_id
    # the run leased before the pause finishes normally
    done = await f.sched.CompleteRun(pb.CompleteRunRequest(lease=held.lease), metadata=f.worker)
    assert done.run.run_id == running.run_id and done.run.status == common_pb2.RUN_STATUS_COMPLETED

    waiting = asyncio.ensure_future(f.claim(wait=dur(20)))
    resumed = await f.sched.ResumeProject(pb.ResumeProjectRequest(project_id="p"), metadata=f.admin)
    assert not resumed.flow.paused
    (c,) = await asyncio.wait_for(waiting, 30)  # nothing lost, and woken by the resume
    assert c.run.run_id == queued.run_id
    actions = [
        r["action"]
        for r in await db.fetch(
            "SELECT action FROM awooop_audit_log WHERE run_id IS NULL AND project_id = 'p' ORDER BY audit_id"
        )
    ]
    assert actions == ["PROJECT_PAUSED", "PROJECT_RESUMED"]


async def test_redrive_requeues_the_failed_runs_a_filter_matches_with_fresh_attempts(
    start_services, channels, db, make_key
) -> None:
    f = await serve(start_services, channels, db, make_key)
    ids = {}
    for name, code in (("quota-1", "E-QUOTA"), ("quota-2", "E-QUOTA"), ("bug", "E-BUG")):
        run = await f.create(name, max_attempts=1)
        (c,) = await f.claim()
        await f.fail(c, error_code=code, retryable=False)
        ids[run.run_id] = name
    cutoff = at(0)
    late = await f.create("quota-late", max_attempts=1)
    (c,) = await f.claim()
    await f.fail(c, error_code="E-QUOTA", retryable=False)
    ok = await f.create("fine")
    (c,) = await f.claim()
    await f.sched.CompleteRun(pb.CompleteRunRequest(lease=c.lease), metadata=f.worker)

    await expect_error(
        f.sched.RedriveRuns(pb.RedriveRunsRequest(project_id="p"), metadata=f.outsider),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    resp = await f.sched.RedriveRuns(
        pb.RedriveRunsRequest(project_id="p", error_code="E-QUOTA", failed_before=cutoff, reason="quota raised"),
        metadata=f.admin,
    )
    assert sorted(ids[r] for r in resp.run_ids) == ["quota-1", "quota-2"] and resp.redriven == 2
    for run_id in resp.run_ids:
        row = await run_row(db, run_id)
        assert row["status"] == "PENDING" and row["error_code"] is None
    for run_id in (late.run_id, ok.run_id):  # outside the time range; not FAILED
        assert (await run_row(db, run_id))["status"] in ("FAILED", "COMPLETED")
    # fresh attempts: a max_attempts=1 run is claimable again, with a new fencing token
    got = await f.claim(max_runs=5)
    assert {c.run.run_id for c in got} == set(resp.run_ids) and all(c.lease.attempt == 2 for c in got)
    action = await db.fetchrow("SELECT actor, reason, details FROM awooop_audit_log WHERE action = 'RUNS_REDRIVEN'")
    assert action is not None and action["reason"] == "quota raised"
    assert json.loads(action["details"])["count"] == 2 and json.loads(action["details"])["error_code"] == "E-QUOTA"
    per_run = await db.fetchval("SELECT count(*) FROM awooop_audit_log WHERE action = 'REDRIVEN'")
    assert per_run == 2
    # a filter that matches nothing requeues nothing, and the operator's action is recorded all the same
    none = await f.sched.RedriveRuns(pb.RedriveRunsRequest(project_id="p", error_code="E-NONE"), metadata=f.admin)
    assert list(none.run_ids) == [] and none.redriven == 0
    entries = await db.fetch("SELECT details FROM awooop_audit_log WHERE action = 'RUNS_REDRIVEN' ORDER BY audit_id")
    assert [json.loads(e["details"])["count"] for e in entries] == [2, 0]


# --- schedules ------------------------------------------------------------------------------------------


async def test_a_schedule_creates_one_run_per_tick_across_two_replicas_and_catches_up_once(
    start_services, channels, db, make_key
) -> None:
    f = await serve(start_services, channels, db, make_key, schedule_interval=0.1)
    second = await start_services("scheduler", schedule_interval=0.1, reaper_interval=3600)  # another replica
    assert second.ports["scheduler"] != f.rt.ports["scheduler"]
    bad = pb.SetScheduleRequest(schedule=pb.Schedule(project_id="p", name="daily", cron="61 * * * *"))
    err = await expect_error(f.sched.SetSchedule(bad, metadata=f.admin), grpc.StatusCode.INVALID_ARGUMENT)
    assert "schedule.cron" in (err.details() or "")
    bad_tz = pb.SetScheduleRequest(schedule=pb.Schedule(project_id="p", name="d", cron="0 6 * * *", time_zone="Mars/X"))
    await expect_error(f.sched.SetSchedule(bad_tz, metadata=f.admin), grpc.StatusCode.INVALID_ARGUMENT)
    await expect_error(
        f.sched.SetSchedule(
            pb.SetScheduleRequest(schedule=pb.Schedule(project_id="p", name="x", cron="* * * * *")), metadata=f.outsider
        ),
        grpc.StatusCode.PERMISSION_DENIED,
    )

    daily = pb.SetScheduleRequest(
        schedule=pb.Schedule(project_id="p", name="daily-report", cron="0 6 * * *", time_zone="Europe/Berlin")
    )
    stored = (await f.sched.SetSchedule(daily, metadata=f.admin)).schedule
    local = stored.next_tick.ToDatetime(tzinfo=dt.UTC).astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (6, 0)  # 06:00 in the schedule's zone

    every_second = pb.SetScheduleRequest(schedule=pb.Schedule(project_id="p", name="tick", cron="* * * * * *"))
    await f.sched.SetSchedule(every_second, metadata=f.admin)

    async def three_ticks() -> bool:
        n = await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE provider_event_id LIKE 'schedule:tick:%'")
        return int(n) >= 3

    await eventually(three_ticks, timeout=30, what="three ticks")
    await f.sched.DeleteSchedule(pb.DeleteScheduleRequest(project_id="p", name="tick"), metadata=f.admin)
    rows = await db.fetch(
        "SELECT provider_event_id, count(*) AS n FROM awooop_run_state"
        " WHERE provider_event_id LIKE 'schedule:tick:%' GROUP BY 1"
    )
    assert rows and all(r["n"] == 1 for r in rows)  # one run per tick, however many replicas fired
    dedupe = await db.fetchval(
        "SELECT count(*) FROM awooop_channel_event_dedupe WHERE provider_event_id LIKE 'schedule:tick:%'"
    )
    assert dedupe == len(rows)

    # downtime: the daily schedule missed a week of ticks; only the latest fires
    await db.execute("UPDATE awooop_schedule SET next_tick = now() - interval '7 days' WHERE name = 'daily-report'")

    async def caught_up() -> int:
        return int(
            await db.fetchval(
                "SELECT count(*) FROM awooop_run_state WHERE provider_event_id LIKE 'schedule:daily-report:%'"
            )
        )

    await eventually(caught_up, timeout=30, what="the catch-up tick")
    nxt = await db.fetchval("SELECT next_tick FROM awooop_schedule WHERE name = 'daily-report'")
    assert nxt > dt.datetime.now(dt.UTC)
    assert await caught_up() == 1
    listed = (await f.sched.ListSchedules(pb.ListSchedulesRequest(project_id="p"), metadata=f.worker)).schedules
    assert [s.name for s in listed] == ["daily-report"]


async def test_a_rate_key_starts_at_most_its_rate_per_window_and_wakes_a_waiting_worker_at_its_end(
    start_services, channels, db, make_key
) -> None:
    f = await serve(start_services, channels, db, make_key)
    rate = pb.SetConcurrencyLimitRequest(project_id="p", key="llm:provider-x", max_starts=3, per=dur(1.0))
    limit = (await f.sched.SetConcurrencyLimit(rate, metadata=f.admin)).limit
    assert (limit.max_starts, limit.max_running, limit.per.seconds) == (3, 0, 1)
    for i in range(7):
        await f.create(f"r{i}", concurrency_key="llm:provider-x")
    got = await f.claim(max_runs=10)
    assert len(got) == 3  # the window's starts
    row = await db.fetchrow(
        "SELECT wait_reason, not_before FROM awooop_run_state"
        " WHERE status = 'PENDING' AND wait_reason IS NOT NULL LIMIT 1"
    )
    assert row["wait_reason"] == "rate_limited"
    assert row["not_before"] < dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)  # the window's end
    for c in got:  # finishing them frees no rate: only the window's end does
        await f.sched.CompleteRun(pb.CompleteRunRequest(lease=c.lease), metadata=f.worker)
    assert await f.claim(max_runs=10) == []
    claimed = [c for _ in range(4) for c in await f.claim(max_runs=10, wait=dur(10)) if c][:4]
    assert len(claimed) == 4
    times = [
        r["created_at"]
        for r in await db.fetch("SELECT created_at FROM awooop_audit_log WHERE action = 'CLAIMED' ORDER BY created_at")
    ]
    # 3 + 3 + 1 starts: three fixed windows, each opened at least a period after the one before
    assert len(times) == 7 and (times[-1] - times[0]).total_seconds() >= 1.9, times
