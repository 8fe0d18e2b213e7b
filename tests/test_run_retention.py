"""Retention of finished runs (AWOOOP_RUN_RETENTION): old terminal runs go with their journal,
compensation request, alerts and audit rows, in bounded batches that concurrent pruners
share without deleting anything twice; runs something may still answer with are kept; a
pruned run answers NOT_FOUND, never INTERNAL; 0 keeps everything."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import grpc

from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common import errors
from services.common.db import create_pool
from services.ingest import retention
from tests.harness.helpers import expect_error
from tests.harness.infra import tg_event

PROJECT = "ops"
DAY = 24 * 3600.0


async def _run(db: asyncpg.Connection, status: str, age_days: float, saga_status: str = "in_progress") -> str:
    """A run finished (or not) age_days ago, with one journaled step and one audit row."""
    run_id = uuid.uuid4()
    await db.execute(
        "INSERT INTO awooop_run_state (run_id, project_id, channel_type, provider_event_id, status, saga_status, "
        "updated_at) VALUES ($1, $2, 'api', $3, $4, $5, now() - make_interval(days => $6))",
        run_id,
        PROJECT,
        f"evt-{run_id}",
        status,
        saga_status,
        int(age_days),
    )
    await db.execute(
        "INSERT INTO awooop_audit_log (project_id, run_id, actor, action) VALUES ($1, $2, 'test', 'created')",
        PROJECT,
        run_id,
    )
    await db.execute(
        "INSERT INTO awooop_saga_step (run_id, step_id, project_id, seq, step_type, status, attempt) "
        "VALUES ($1, 's1', $2, 1, 'llm_call', 'completed', 1)",
        run_id,
        PROJECT,
    )
    return str(run_id)


async def _exists(db: asyncpg.Connection, run_id: str) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE run_id = $1::uuid", run_id))


async def test_old_finished_runs_go_with_their_rows_and_runs_still_answered_for_stay(
    db: asyncpg.Connection, settings: Any
) -> None:
    old = [await _run(db, s, 40) for s in ("COMPLETED", "FAILED", "CANCELLED") for _ in range(10)]
    recent = await _run(db, "COMPLETED", 5)
    live = await _run(db, "RUNNING", 40)
    compensating = await _run(db, "FAILED", 40, saga_status="compensating")
    failed_undo = await _run(db, "FAILED", 40, saga_status="compensation_failed")
    deduped = await _run(db, "COMPLETED", 40)
    await db.execute(
        "INSERT INTO awooop_channel_event_dedupe (project_id, channel_type, provider_event_id, run_id) "
        "SELECT project_id, channel_type, provider_event_id, run_id FROM awooop_run_state WHERE run_id = $1::uuid",
        deduped,
    )
    keyed = await _run(db, "COMPLETED", 40)
    await db.execute(
        "INSERT INTO awooop_idempotency_key (project_id, principal_type, principal_id, operation, key, "
        "request_fingerprint, policy_version, response_snapshot, resource_id, expires_at) "
        "VALUES ($1, 'user', 'u', 'ingest.CreateRun', 'k', repeat('0', 64), 'v1', '', $2, now() + interval '1 hour')",
        PROJECT,
        keyed,
    )
    open_undo = await _run(db, "FAILED", 40, saga_status="compensated")
    await db.execute(
        "INSERT INTO awooop_compensation_request (run_id, project_id, trigger) VALUES ($1::uuid, $2, 'step_failed')",
        open_undo,
        PROJECT,
    )
    kept = [recent, live, compensating, failed_undo, deduped, keyed, open_undo]

    # two pruners at once (two replicas), in batches of 4: each run is deleted once
    pools = [await create_pool(settings), await create_pool(settings)]
    try:
        got = await asyncio.gather(*(retention.prune_runs(p, retention=30 * DAY, batch=4) for p in pools))
        assert sum(got) == len(old)
        assert await retention.prune_runs(pools[0], retention=0, batch=4) == 0  # 0 keeps
    finally:
        for p in pools:
            await p.close()
    for r in old:
        assert not await _exists(db, r)
    for r in kept:
        assert await _exists(db, r), r
    old_ids = [uuid.UUID(r) for r in old]
    for table in ("awooop_audit_log", "awooop_saga_step", "awooop_run_event"):  # the log goes with its run
        assert await db.fetchval(f"SELECT count(*) FROM {table} WHERE run_id = ANY($1)", old_ids) == 0
        assert await db.fetchval(f"SELECT count(*) FROM {table} WHERE run_id = ANY($1)", [uuid.UUID(k) for k in kept])


async def test_a_pruned_run_answers_not_found_and_its_event_replays_stay_correct(
    start_services: Any, channels: Any, make_key: Any, db: asyncpg.Connection
) -> None:
    rt = await start_services("ingest", "scheduler", run_retention=1.0, prune_interval=3600)
    md = await make_key("alice", {PROJECT: ["ingest", "admin"]})
    ingest = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    sched = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    run_id = (await ingest.IngestEvent(tg_event(PROJECT, 77), metadata=md)).outcomes[0].run_id
    await db.execute(
        "UPDATE awooop_run_state SET status = 'COMPLETED', updated_at = now() - interval '1 day' "
        "WHERE run_id = $1::uuid",
        run_id,
    )
    # its dedupe row is live: kept, and a provider retry still answers the same run
    assert rt.ctx is not None
    assert await retention.prune_runs(rt.ctx.pool, retention=1.0, batch=100) == 0
    again = (await ingest.IngestEvent(tg_event(PROJECT, 77), metadata=md)).outcomes[0]
    assert again.run_id == run_id and again.duplicate
    # once the dedupe row has gone, the run goes; reading it is NOT_FOUND, never INTERNAL
    await db.execute("DELETE FROM awooop_channel_event_dedupe WHERE run_id = $1::uuid", run_id)
    assert await retention.prune_runs(rt.ctx.pool, retention=1.0, batch=100) == 1
    await expect_error(
        sched.GetRun(scheduler_pb2.GetRunRequest(run_id=run_id), metadata=md),
        grpc.StatusCode.NOT_FOUND,
        errors.NOT_FOUND,
    )
    # a CreateRun key still live keeps its run and replays it
    req = ingest_pb2.CreateRunRequest(project_id=PROJECT, idempotency_key="create-1")
    created = await ingest.CreateRun(req, metadata=md)
    await db.execute(
        "UPDATE awooop_run_state SET status = 'CANCELLED', updated_at = now() - interval '1 day' "
        "WHERE run_id = $1::uuid",
        created.run.run_id,
    )
    assert await retention.prune_runs(rt.ctx.pool, retention=1.0, batch=100) == 0
    replay = await ingest.CreateRun(req, metadata=md)
    assert replay.run.run_id == created.run.run_id


async def test_runs_that_really_ended_are_pruned(
    start_services: Any, channels: Any, make_key: Any, db: asyncpg.Connection
) -> None:
    """Runs finished through the services carry the saga status their end gave them (a completed
    run, and a failed one with nothing to undo: not_needed), and retention takes them."""
    rt = await start_services("ingest", "scheduler", run_retention=1.0, prune_interval=3600)
    md = await make_key("alice", {PROJECT: ["ingest", "worker"]})
    ingest = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    sched = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    await ingest.IngestEvents(
        ingest_pb2.IngestEventsRequest(events=[tg_event(PROJECT, 81), tg_event(PROJECT, 82)]), metadata=md
    )
    claimed = await sched.ClaimRuns(
        scheduler_pb2.ClaimRunsRequest(worker_id="w", project_ids=[PROJECT], max_runs=2), metadata=md
    )
    done, failed = claimed.runs
    await sched.CompleteRun(scheduler_pb2.CompleteRunRequest(lease=done.lease), metadata=md)
    await sched.FailRun(scheduler_pb2.FailRunRequest(lease=failed.lease, reason="no", retryable=False), metadata=md)
    ended = [uuid.UUID(done.run.run_id), uuid.UUID(failed.run.run_id)]
    rows = await db.fetch("SELECT status, saga_status FROM awooop_run_state WHERE run_id = ANY($1)", ended)
    assert sorted((r["status"], r["saga_status"]) for r in rows) == [
        ("COMPLETED", "not_needed"),
        ("FAILED", "not_needed"),
    ]
    # past retention, and their events' dedupe rows pruned: nothing answers with them any more
    await db.execute("UPDATE awooop_run_state SET updated_at = now() - interval '1 day' WHERE run_id = ANY($1)", ended)
    await db.execute("DELETE FROM awooop_channel_event_dedupe WHERE run_id = ANY($1)", ended)
    assert rt.ctx is not None
    assert await retention.prune_runs(rt.ctx.pool, retention=1.0, batch=100) == 2
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE run_id = ANY($1)", ended) == 0
