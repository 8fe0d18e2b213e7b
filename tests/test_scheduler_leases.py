"""Scheduler under concurrency and failure: 10 concurrent workers never claim the same run,
the reaper (direct passes, several replicas at once, and its loop), WAITING_APPROVAL is
never reaped, max_attempts, the LISTEN connection dropping, and compensation requests
reaching the real saga service (and surviving when it is down)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from typing import Any

import grpc
import pytest_asyncio
from prometheus_client import REGISTRY

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common import errors
from services.common.db import create_pool
from services.scheduler import reaper, reaper_sql
from services.scheduler.saga_client import SagaNudger
from tests.harness.helpers import eventually, expect_error
from tests.harness.scheduler import (
    Sched,
    add_compensatable_step,
    audit_actions,
    claims_waiting,
    comp_request,
    dur,
    expire_lease,
    insert_runs,
    make_sched,
    run_row,
    wait_listening,
)

FP = grpc.StatusCode.FAILED_PRECONDITION


@pytest_asyncio.fixture(loop_scope="session")
async def s(start_services, channels, db, make_key) -> Sched:
    return await make_sched(start_services, channels, db, make_key)


def reaped_metric(outcome: str) -> float:
    return REGISTRY.get_sample_value("awooop_scheduler_reaped_total", {"outcome": outcome}) or 0.0


# --- 10 concurrent workers --------------------------------------------------------------------------


async def test_ten_concurrent_workers_never_claim_the_same_run(s: Sched, channels) -> None:
    """300 runs, 10 workers on separate channels claiming in batches until everything is done.
    Every run fails retryably on its first attempt and completes on its second, so each run is
    claimed exactly twice, once per attempt, and never by two workers for the same attempt."""
    n_runs, n_workers = 300, 10
    run_ids = set(await insert_runs(s.db, "p", n_runs))
    claims: list[tuple[str, int, str]] = []  # (run_id, attempt, worker)
    completed: set[str] = set()
    all_done = asyncio.Event()

    async def worker(i: int) -> None:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channels(s.rt.ports["scheduler"]))
        wid = f"worker-{i}"
        while not all_done.is_set():
            resp = await stub.ClaimRuns(
                pb.ClaimRunsRequest(worker_id=wid, project_ids=["p"], max_runs=7, wait=dur(0.2)), metadata=s.worker
            )
            for c in resp.runs:
                claims.append((c.run.run_id, c.lease.attempt, wid))
                if c.lease.attempt == 1:
                    await stub.FailRun(
                        pb.FailRunRequest(lease=c.lease, reason="first try", retryable=True, retry_after=dur(0.001)),
                        metadata=s.worker,
                    )
                else:
                    await stub.CompleteRun(pb.CompleteRunRequest(lease=c.lease), metadata=s.worker)
                    completed.add(c.run.run_id)
            if len(completed) == n_runs:
                all_done.set()

    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(n_workers))), 240)

    # by the returned ids: every (run, attempt) exactly once, attempts 1 and 2 for every run
    pairs = Counter((r, a) for r, a, _ in claims)
    assert all(n == 1 for n in pairs.values()), [p for p, n in pairs.items() if n > 1]
    assert set(pairs) == {(r, a) for r in run_ids for a in (1, 2)}
    assert len({w for _, _, w in claims}) > 1  # the work really was shared
    # by the audit log: two CLAIMED rows per run, with attempts 1 and 2, one worker each
    rows = await s.db.fetch(
        """SELECT run_id::text, array_agg((details->>'attempt')::int ORDER BY audit_id) AS attempts,
                  count(DISTINCT (details->>'attempt', details->>'worker_id')) AS holders
             FROM awooop_audit_log WHERE action = 'CLAIMED' GROUP BY run_id"""
    )
    assert {r["run_id"] for r in rows} == run_ids
    assert all(r["attempts"] == [1, 2] and r["holders"] == 2 for r in rows)
    assert await s.db.fetchval("SELECT count(*) FROM awooop_run_state WHERE status <> 'COMPLETED'") == 0


async def test_claims_at_the_store_level_are_disjoint(s: Sched) -> None:
    """The claim statement alone, 10 at once on separate connections: no run twice."""
    from services.scheduler import claiming

    await insert_runs(s.db, "p", 200)
    pool = await create_pool(s.rt.settings.with_(db_pool_max=10))
    try:
        batches = await asyncio.gather(*(claiming.claim(pool, ["p"], 25, 60.0, f"w{i}", "test") for i in range(10)))
    finally:
        await pool.close()
    ids = [str(r["run_id"]) for b in batches for r in b]
    assert len(ids) == 200 and len(set(ids)) == 200


async def test_no_index_reads_the_columns_a_heartbeat_changes(s: Sched) -> None:
    """Heartbeats are HOT updates only while no index of awooop_run_state (key, INCLUDE,
    expression or predicate) mentions lease_until or heartbeat_at (migration 0040)."""
    rows = await s.db.fetch(
        """SELECT i.indexrelid::regclass::text AS name, a.attname AS col, pg_get_indexdef(i.indexrelid) AS def
             FROM pg_index i
             LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
            WHERE i.indrelid = 'awooop_run_state'::regclass"""
    )
    assert {r["name"] for r in rows} >= {"awooop_run_leased_idx", "awooop_run_claim_idx"}
    for r in rows:
        assert r["col"] not in ("lease_until", "heartbeat_at"), r["def"]
        assert "lease_until" not in r["def"] and "heartbeat_at" not in r["def"], r["def"]


async def test_a_heartbeat_is_a_hot_update(s: Sched) -> None:
    """The heartbeat statement renews 5 leases without touching any index (counted by the
    transaction's own statistics, which are exact)."""
    from services.scheduler import claiming, leases

    await insert_runs(s.db, "p", 5)
    claimed = await claiming.claim(s.pool, ["p"], 5, 60.0, "w1", "test")
    async with s.db.transaction():
        renewed = await leases.heartbeat(
            s.db,  # type: ignore[arg-type]
            "w1",
            [(str(r["run_id"]), r["attempt_count"]) for r in claimed],
            60.0,
            None,
        )
        assert all(r.lease_until is not None for r in renewed)
        hot = await s.db.fetchval("SELECT pg_stat_get_xact_tuples_hot_updated('awooop_run_state'::regclass)")
        updated = await s.db.fetchval("SELECT pg_stat_get_xact_tuples_updated('awooop_run_state'::regclass)")
    assert updated == 5 and hot == 5


async def test_the_claim_statements_generic_plans_probe_indexes(s: Sched) -> None:
    """Postgres keeps a prepared statement's generic plan (and stops planning it per call) when
    it is no worse than the per-call plans; the claim statements are written so that it is the
    good plan: the claim index scan and primary-key probes, no sequential scan."""
    from services.scheduler import claiming

    await s.db.execute(
        """INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status)
           SELECT CASE WHEN g % 10 = 0 THEN 'p' ELSE 'q' END, 'api', 'plan-' || g,
                  CASE WHEN g % 3 = 0 THEN 'PENDING' ELSE 'COMPLETED' END
             FROM generate_series(1, 20000) AS g"""
    )
    ids = await insert_runs(s.db, "p", 3)
    await s.db.execute("ANALYZE awooop_run_state")
    # the parameters as SQL literals, by name (a claim without a claim id: its key NULL)
    literals = {
        "projects": "'{p}'",
        "lease_secs": "60.0",
        "worker_id": "'w1'",
        "actor": "'test'",
        "principal": "NULL",
        "claim_id": "NULL",
        "sorted_projects": "NULL",
        "run_ids": f"ARRAY{[str(i) for i in ids]}::uuid[]",
        "attempts": "'{1,1,1}'",
        "outputs": "ARRAY['{}', '{}', '{}']",
        "allowed": "'{RUNNING}'",
        "worker_projects": "NULL",
        "build_id": "''",
        "labels": "'{}'",
        "prefer_secs": "10.0",
        "live_secs": "60.0",
    }
    no_completions = {**literals, "run_ids": "'{}'", "attempts": "'{}'", "outputs": "'{}'"}
    st = claiming.claim_statement(1, 10)
    for name, values in {"claim": no_completions, "complete and claim": literals}.items():
        sql, args = st.sql, "(" + ", ".join(values[p] for p in st.params) + ")"
        async with s.db.transaction():
            await s.db.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            await s.db.execute(f"PREPARE generic_claim AS {sql}")
            plan = "\n".join(r[0] for r in await s.db.fetch(f"EXPLAIN EXECUTE generic_claim{args}"))
            await s.db.execute("DEALLOCATE generic_claim")
        assert "awooop_run_claim_idx" in plan and "awooop_run_state_pkey" in plan, (name, plan)
        assert "Seq Scan on awooop_run_state" not in plan, (name, plan)


async def test_the_multi_project_claim_settles_on_its_generic_plan(s: Sched) -> None:
    """A worker claiming for several projects sends one prepared statement per call; after its
    five custom plans Postgres must keep the generic one, not plan the statement on every call.
    Without the projects' count in the text (claims.sql ClaimRuns, {{count}}) it planned
    per call on these statistics: its generic plan costed ten projects' scans."""
    from services.scheduler import claim_answers, claiming, workers

    await s.db.execute(
        """INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status, not_before, created_at)
           SELECT v.p, 'api', v.p || '-' || g, 'PENDING', v.nb, now() - interval '1 hour' + g * interval '1 ms'
             FROM (VALUES ('p', 1000, NULL::timestamptz), ('p', 10000, 'infinity'), ('q', 1000, NULL),
                          ('small', 10, NULL), ('big', 10000, NULL)) AS v(p, n, nb),
                  generate_series(1, v.n) AS g"""
    )
    await s.db.execute("VACUUM ANALYZE awooop_run_state")
    st = claiming.claim_statement(2, 10)
    sql = st.sql
    # builds as the scheduler passes them: "" for a worker that declares none (NULL would be folded
    # into a custom plan costed below the generic one: planned on every call), or its build
    for i, projects in enumerate([["q", "big"]] * 6 + [["q", "small"]] * 6):
        tr = s.db.transaction()
        await tr.start()
        args = st.args(
            projects=projects,
            lease_secs=60.0,
            worker_id="w1",
            actor="test",
            **workers.Routing(build_id=("", "v1")[i % 2], labels_json=("{}", '{"gpu": "a100"}')[i % 2]).params(),
            **claim_answers.NO_KEY,
            **claiming.NO_COMPLETIONS,
        )
        assert len(await s.db.fetch(sql, *args)) == 10
        await tr.rollback()
    plans = await s.db.fetchrow(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1", sql
    )
    assert plans is not None and plans["generic_plans"] > plans["custom_plans"], plans


# --- the reaper -------------------------------------------------------------------------------------


async def test_reaper_takes_back_only_expired_leases_and_never_waiting_approval(s: Sched) -> None:
    ids = await insert_runs(s.db, "p", 5)
    running, fresh, tool, approval = await s.claim(max_runs=4)
    await s.stub.WaitTool(pb.WaitToolRequest(lease=tool.lease, tool_id="t"), metadata=s.worker)
    await s.stub.RequestApproval(pb.RequestApprovalRequest(lease=approval.lease, ttl=dur(0.05)), metadata=s.worker)
    for r in (running, tool):
        await expire_lease(s.db, r.run.run_id)
    # a WAITING_APPROVAL row with a stale lease deadline and an expired token: still not the reaper's
    await expire_lease(s.db, approval.run.run_id)
    await eventually(lambda: _past(s, approval.run.run_id), what="the approval to expire")
    before = reaped_metric("requeued")
    result = await s.reap()
    assert (result.requeued, result.failed, result.cancelled) == (2, 0, 0)
    assert reaped_metric("requeued") - before == 2
    for r in (running, tool):
        row = await run_row(s.db, r.run.run_id)
        assert row["status"] == "PENDING" and row["reaped_at"] is not None
        assert row["worker_id"] is None and row["lease_until"] is None
        hist = await s.db.fetchrow(
            "SELECT * FROM awooop_audit_log WHERE run_id = $1 ORDER BY audit_id DESC LIMIT 1", uuid.UUID(r.run.run_id)
        )
        assert hist["action"] == "REAPED" and hist["actor"] == "system:reaper" and hist["to_status"] == "PENDING"
    assert (await run_row(s.db, fresh.run.run_id))["status"] == "RUNNING"
    assert (await run_row(s.db, approval.run.run_id))["status"] == "WAITING_APPROVAL"
    assert (await run_row(s.db, ids[4]))["status"] == "PENDING"
    assert (await s.reap()).total == 0


async def test_the_reaper_and_the_queue_sample_read_no_parked_run(s: Sched) -> None:
    """Runs parked on durable waits (WAITING_TOOL without a worker or lease) are outside the
    leased runs' index (migration 0161): the reaper's scans read only the leases held, counted
    by the rows its index scan returns, and the queue sample still counts the parked runs
    through their own index (no sequential scan of the table)."""
    from services.scheduler import queue_sql

    await s.db.execute(
        """INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status, attempt_count,
                                         released_count)
           SELECT 'p', 'api', 'parked-' || g, 'WAITING_TOOL', 2, 2 FROM generate_series(1, 2000) AS g"""
    )
    await s.db.execute(
        """INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, status)
           SELECT 'p', 'api', 'done-' || g, 'COMPLETED' FROM generate_series(1, 20000) AS g"""
    )
    await insert_runs(s.db, "p", 3)
    await s.claim(max_runs=3)
    await s.db.execute("VACUUM ANALYZE awooop_run_state")

    def index_rows(plan: dict[str, Any], index: str) -> list[int]:
        """The rows each scan of the index read (an index scan's filter drops them after reading)."""
        read = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
        found = [read] if plan.get("Index Name") == index else []
        return found + [n for child in plan.get("Plans", []) for n in index_rows(child, index)]

    def seq_scans(plan: dict[str, Any]) -> list[str]:
        found = [plan.get("Relation Name", "")] if plan["Node Type"] == "Seq Scan" else []
        return found + [n for child in plan.get("Plans", []) for n in seq_scans(child)]

    async def explain(sql: str, *args: Any) -> dict[str, Any]:
        async with s.db.transaction():  # EXPLAIN ANALYZE runs it: nothing is expired, nothing changes
            raw = await s.db.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args)
        plan: dict[str, Any] = json.loads(raw)[0]["Plan"]
        return plan

    reap = reaper_sql.REAP_EXPIRED_LEASES.args(
        batch=1000, actor="test", channel="awooop_run_ready", policy="{}", only_run=None
    )
    for name, plan in [
        ("ExpiredLeases", await explain(reaper_sql.EXPIRED_LEASES.sql, *reaper_sql.EXPIRED_LEASES.args(batch=1000))),
        ("ReapExpiredLeases", await explain(reaper_sql.REAP_EXPIRED_LEASES.sql, *reap)),
    ]:
        assert index_rows(plan, "awooop_run_leased_idx") == [3], (name, plan)
    sampled = await explain(queue_sql.SAMPLE_QUEUE.sql)
    assert index_rows(sampled, "awooop_run_waiting_idx") == [2000], sampled
    assert "awooop_run_state" not in seq_scans(sampled), sampled
    counts = {(r["status"]): r["n"] for r in await s.db.fetch(queue_sql.SAMPLE_QUEUE.sql)}
    assert counts == {"WAITING_TOOL": 2000, "RUNNING": 3}


async def _past(s: Sched, run_id: str) -> bool:
    sql = "SELECT approval_expires_at < now() FROM awooop_run_state WHERE run_id = $1"
    return bool(await s.db.fetchval(sql, uuid.UUID(run_id)))


async def test_max_attempts_3_the_third_expiry_fails_the_run_and_no_fourth_claim_happens(s: Sched) -> None:
    """seed 000 D3/D5: re-queued while attempt_count < max_attempts, else FAILED."""
    (run_id,) = await insert_runs(s.db, "p", 1, max_attempts=3)
    await add_compensatable_step(s.db, run_id, "p")
    for attempt in (1, 2, 3):
        r = await s.claim_one(f"w{attempt}")
        assert r.lease.attempt == attempt
        await expire_lease(s.db, run_id)
        result = await s.reap()
        if attempt < 3:
            assert result.requeued == 1 and (await run_row(s.db, run_id))["status"] == "PENDING"
        else:
            assert result.failed == 1
    row = await run_row(s.db, run_id)
    assert row["status"] == "FAILED" and row["failure_reason"] == "Max retry attempts exceeded"
    assert row["error_code"] == "E-RUN-MAX-ATTEMPTS" and row["attempt_count"] == 3
    assert (await comp_request(s.db, run_id))["trigger"] == "step_failed"  # type: ignore[index]
    assert await s.claim(max_runs=5) == []
    assert await audit_actions(s.db, run_id) == [
        "CLAIMED", "REAPED", "CLAIMED", "REAPED", "CLAIMED", "REAPED_FAILED", "COMPENSATION_REQUESTED",
    ]  # fmt: skip


async def test_several_reaper_replicas_reap_each_run_exactly_once(s: Sched) -> None:
    await insert_runs(s.db, "p", 300)
    claimed = []
    while batch := await s.claim(max_runs=100):
        claimed += batch
    assert len(claimed) == 300
    await s.db.execute("UPDATE awooop_run_state SET lease_until = now() - interval '1 second'")
    pools = [await create_pool(s.rt.settings.with_(db_pool_max=2)) for _ in range(4)]
    saga = SagaNudger(s.rt.settings)
    try:
        results = await asyncio.gather(*(reaper.reap(p, saga, batch=40) for p in pools for _ in range(2)))
    finally:
        for p in pools:
            await p.close()
    assert sum(r.requeued for r in results) == 300
    per_run = await s.db.fetch(
        "SELECT run_id, count(*) AS n FROM awooop_audit_log WHERE action = 'REAPED' GROUP BY run_id"
    )
    assert len(per_run) == 300 and all(r["n"] == 1 for r in per_run)
    assert await s.db.fetchval("SELECT count(*) FROM awooop_run_state WHERE status = 'PENDING'") == 300


async def test_the_reaper_loop_requeues_a_silent_worker_and_wakes_a_waiting_claim(
    start_services, channels, db, make_key
) -> None:
    s = await make_sched(start_services, channels, db, make_key, reaper_interval=0.2, lease_ttl=1.0)
    await wait_listening(s)
    (run_id,) = await insert_runs(db, "p", 1)
    first = await s.claim_one("silent")  # never heartbeats
    successor = asyncio.ensure_future(s.claim("w2", wait=dur(60)))
    await eventually(lambda: claims_waiting(1), what="the successor to wait")
    (again,) = await asyncio.wait_for(successor, 30)  # woken by the reap's NOTIFY
    assert again.run.run_id == run_id and again.lease.attempt == 2 and again.resumed
    assert (await run_row(db, run_id))["reaped_at"] is not None
    assert await audit_actions(db, run_id) == ["CLAIMED", "REAPED", "CLAIMED"]
    (o,) = await s.heartbeat("silent", first.lease)
    assert o.outcome == pb.LEASE_OUTCOME_LEASE_LOST


async def test_a_heartbeating_worker_keeps_its_lease_through_reaper_passes(
    start_services, channels, db, make_key
) -> None:
    s = await make_sched(start_services, channels, db, make_key, reaper_interval=0.1, lease_ttl=1.5)
    (run_id,) = await insert_runs(db, "p", 1)
    r = await s.claim_one()
    passes = REGISTRY.get_sample_value("awooop_background_runs_total", {"loop": "scheduler.reaper", "outcome": "ok"})
    for _ in range(8):  # ~2.4 s: longer than the lease, many reaper passes
        (o,) = await s.heartbeat("w1", r.lease)
        assert o.outcome == pb.LEASE_OUTCOME_RENEWED
        await asyncio.sleep(0.3)  # the worker's heartbeat cadence
    after = REGISTRY.get_sample_value("awooop_background_runs_total", {"loop": "scheduler.reaper", "outcome": "ok"})
    assert (after or 0) - (passes or 0) >= 5  # the reaper did run meanwhile
    assert (await run_row(db, run_id))["status"] == "RUNNING"
    assert await audit_actions(db, run_id) == ["CLAIMED"]


# --- the LISTEN connection --------------------------------------------------------------------------


async def test_claims_still_wake_after_the_listen_connection_is_killed(s: Sched) -> None:
    await wait_listening(s)
    old = await s.db.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'awooop-scheduler-listen'"
        " AND datname = current_database()"
    )
    await s.db.execute("SELECT pg_terminate_backend($1)", old)

    # while it is down, a waiting claim polls: it still gets new work
    (first,) = await insert_runs(s.db, "p", 1)
    got = await asyncio.wait_for(s.claim(wait=dur(30)), 20)
    assert [c.run.run_id for c in got] == [first]

    async def reconnected() -> bool:
        pid = await s.db.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'awooop-scheduler-listen'"
            " AND datname = current_database()"
        )
        return pid is not None and pid != old

    await eventually(reconnected, what="the LISTEN connection to come back")
    task = asyncio.ensure_future(s.claim(wait=dur(60)))
    await eventually(lambda: claims_waiting(1), what="the claim to wait")
    (second,) = await insert_runs(s.db, "p", 1)
    assert [c.run.run_id for c in await asyncio.wait_for(task, 20)] == [second]


# --- compensation requests reach the saga service ---------------------------------------------------


async def _internal_key(make_key) -> str:
    md = await make_key("scheduler-svc", {"*": ["admin"]}, "service")
    return md[0][1].removeprefix("Bearer ")


async def test_compensation_request_is_sent_to_the_real_saga_service(start_services, channels, db, make_key) -> None:
    saga_rt = await start_services("saga", compensation_interval=3600)
    s = await make_sched(
        start_services,
        channels,
        db,
        make_key,
        saga_addr=f"127.0.0.1:{saga_rt.ports['saga']}",
        internal_api_key=await _internal_key(make_key),
    )
    (run_id,) = await insert_runs(db, "p", 1)
    r = await s.claim_one()
    await add_compensatable_step(db, run_id, "p")
    ok_before = REGISTRY.get_sample_value("awooop_scheduler_saga_nudges_total", {"outcome": "ok"}) or 0
    resp = await s.stub.FailRun(pb.FailRunRequest(lease=r.lease, reason="broken"), metadata=s.worker)
    assert resp.compensation_requested

    async def nudged() -> bool:
        ok = REGISTRY.get_sample_value("awooop_scheduler_saga_nudges_total", {"outcome": "ok"}) or 0
        return ok > ok_before

    await eventually(nudged, what="the Compensate RPC")

    # the saga service was kicked (its own loop sleeps for an hour): it takes the request up
    async def driven() -> bool:
        req = await comp_request(db, run_id)
        return req is not None and req["attempt_count"] > 0

    await eventually(driven, what="the saga driver to pick the request up")


async def test_a_lost_saga_rpc_loses_no_compensation(start_services, channels, db, make_key) -> None:
    from services.common.embedded import free_port

    s = await make_sched(
        start_services, channels, db, make_key, saga_addr=f"127.0.0.1:{free_port()}", internal_api_key="awk_x_y"
    )
    (run_id,) = await insert_runs(db, "p", 1)
    r = await s.claim_one()
    await add_compensatable_step(db, run_id, "p")
    err_before = REGISTRY.get_sample_value("awooop_scheduler_saga_nudges_total", {"outcome": "error"}) or 0
    resp = await s.stub.FailRun(pb.FailRunRequest(lease=r.lease, reason="broken"), metadata=s.worker)
    assert resp.compensation_requested and resp.run.status == common_pb2.RUN_STATUS_FAILED

    async def failed_nudge() -> bool:
        return (REGISTRY.get_sample_value("awooop_scheduler_saga_nudges_total", {"outcome": "error"}) or 0) > err_before

    await eventually(failed_nudge, what="the nudge to fail")
    req = await comp_request(db, run_id)
    assert req is not None and req["status"] == "pending" and req["trigger"] == "step_failed"
    # a saga service started later finds it by itself (its recovery loop)
    saga_rt = await start_services("saga", compensation_interval=0.2)
    assert saga_rt.ports["saga"]

    async def driven() -> bool:
        row = await comp_request(db, run_id)
        return row is not None and row["attempt_count"] > 0

    await eventually(driven, what="the saga's recovery loop to take the request")


async def test_journal_writes_of_a_reaped_worker_are_lease_lost(start_services, channels, db, make_key) -> None:
    s = await make_sched(start_services, channels, db, make_key)
    saga_rt = await start_services("saga", compensation_interval=3600)
    saga = saga_pb2_grpc.SagaServiceStub(channels(saga_rt.ports["saga"]))
    (run_id,) = await insert_runs(db, "p", 1)
    r = await s.claim_one()
    begun = await saga.BeginStep(
        saga_pb2.BeginStepRequest(lease=r.lease, step_id="s1", step_type=common_pb2.STEP_TYPE_TOOL_CALL, tool_id="t"),
        metadata=s.worker,
    )
    assert begun.action == saga_pb2.STEP_ACTION_EXECUTE
    await expire_lease(db, run_id)
    assert (await s.reap()).requeued == 1
    before = [dict(x) for x in await db.fetch("SELECT * FROM awooop_saga_step WHERE run_id = $1", uuid.UUID(run_id))]
    calls: list[Any] = [
        saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=r.lease, step_id="s1"), metadata=s.worker),
        saga.FailStep(saga_pb2.FailStepRequest(lease=r.lease, step_id="s1", error="late"), metadata=s.worker),
        saga.BeginStep(
            saga_pb2.BeginStepRequest(lease=r.lease, step_id="s2", step_type=common_pb2.STEP_TYPE_LLM_CALL),
            metadata=s.worker,
        ),
    ]
    for call in calls:
        await expect_error(call, FP, errors.LEASE_LOST)
    after = [dict(x) for x in await db.fetch("SELECT * FROM awooop_saga_step WHERE run_id = $1", uuid.UUID(run_id))]
    assert after == before
