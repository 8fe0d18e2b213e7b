"""Deliverability before commit: what is accepted fits every answer that returns it, a claim
never commits runs its answer cannot carry, list and batch answers stay under the message
limit, and inconsistent limits stop the service at start-up. Real services, real store."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common import errors
from services.common.runtime import Runtime
from services.common.settings import Settings
from tests.harness.helpers import expect_error

BLOB = 250_000  # under the default 256 KiB payload limit; 20 of them are ~5 MB > 4 MiB


async def _services(start_services: Any, channels: Any, make_key: Any) -> tuple[Any, Any, Any]:
    rt = await start_services("ingest", "scheduler", reaper_interval=3600)
    ingest = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    sched = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    md = await make_key("alice", {"p": ["ingest", "worker", "admin"]})
    return ingest, sched, md


async def _big_runs(ingest: Any, md: Any, n: int) -> list[str]:
    ids = []
    for i in range(n):
        data = struct_pb2.Struct()
        data.update({"i": i, "blob": chr(ord("a") + i % 26) * BLOB})
        resp = await ingest.CreateRun(
            ingest_pb2.CreateRunRequest(project_id="p", idempotency_key=f"big-{i}", input=data), metadata=md
        )
        ids.append(resp.run.run_id)
    return ids


async def test_twenty_large_runs_are_all_delivered_across_several_claims_and_none_fails(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    ingest, sched, md = await _services(start_services, channels, make_key)
    ids = await _big_runs(ingest, md, 20)
    delivered: list[pb.ClaimedRun] = []
    claims = 0
    while len(delivered) < 20:
        claims += 1
        assert claims <= 20, "claims stopped delivering"
        resp = await sched.ClaimRuns(pb.ClaimRunsRequest(worker_id="w", project_ids=["p"], max_runs=20), metadata=md)
        assert resp.runs, "a claimable run was left behind"
        assert resp.ByteSize() <= 4 * 1024 * 1024
        delivered += resp.runs
    assert claims > 1
    assert sorted(c.run.run_id for c in delivered) == sorted(ids)
    assert all(len(c.run.input["blob"]) == BLOB for c in delivered)
    # nothing burned: every run is on its first counted attempt, none failed
    rows = await db.fetch("SELECT status, attempt_count - released_count AS used FROM awooop_run_state")
    assert {(r["status"], r["used"]) for r in rows} == {("RUNNING", 1)}
    # all completed in one CompleteRuns: every item answered, the answer under the limit
    items = [pb.CompleteRunRequest(lease=c.lease) for c in delivered]
    for c, item in zip(delivered, items, strict=True):
        item.output.update({"blob": c.run.input["blob"]})
    done = await sched.CompleteRuns(pb.CompleteRunsRequest(runs=items[:10]), metadata=md)
    assert [r.run.status for r in done.results] == [common_pb2.RUN_STATUS_COMPLETED] * 10
    assert done.ByteSize() <= 4 * 1024 * 1024
    carried = await sched.ClaimRuns(
        pb.ClaimRunsRequest(worker_id="w", project_ids=["p"], max_runs=20, complete=items[10:]), metadata=md
    )
    assert [r.run.status for r in carried.completed] == [common_pb2.RUN_STATUS_COMPLETED] * 10
    assert not carried.runs
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE status = 'COMPLETED'") == 20
    # ListRuns with a page that cannot hold them all: pages end early, every run listed once
    listed: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await sched.ListRuns(pb.ListRunsRequest(project_id="p", page_size=500, page_token=token), metadata=md)
        pages += 1
        assert page.ByteSize() <= 4 * 1024 * 1024
        listed += [r.run_id for r in page.runs]
        token = page.next_page_token
        if not token:
            break
    assert pages > 1 and sorted(listed) == sorted(ids)


async def test_a_payload_whose_encoding_is_too_large_is_refused_at_creation(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    ingest, _, md = await _services(start_services, channels, make_key)
    numbers = struct_pb2.Struct()
    numbers.update({"n": [1] * 40_000})  # ~80 KB as JSON, ~440 KB encoded (11 bytes per number)
    assert numbers.ByteSize() > 256 * 1024
    err = await expect_error(
        ingest.CreateRun(ingest_pb2.CreateRunRequest(project_id="p", idempotency_key="n", input=numbers), metadata=md),
        grpc.StatusCode.INVALID_ARGUMENT,
        errors.FIELD_INVALID,
    )
    assert "encoded" in err.details()
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == 0


async def test_inconsistent_payload_and_message_limits_stop_the_start(settings: Settings) -> None:
    rt = Runtime(settings.with_(max_message_bytes=300 * 1024), ["scheduler"], port_zero=True)
    with pytest.raises(SystemExit) as exc:
        await rt.start()
    text = str(exc.value)
    assert "AWOOOP_MAX_MESSAGE_BYTES" in text and "AWOOOP_MAX_PAYLOAD_BYTES" in text


async def test_a_history_larger_than_one_message_is_a_clear_resource_exhausted(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    _, sched, md = await _services(start_services, channels, make_key)
    run_id = await db.fetchval(
        "INSERT INTO awooop_run_state (project_id, channel_type, input) VALUES ('p', 'api', '{}') RETURNING run_id"
    )
    await db.execute(
        """INSERT INTO awooop_audit_log (project_id, run_id, actor, action, reason)
           SELECT 'p', $1, 'test', 'NOTE', repeat('é', 4096) FROM generate_series(1, 1000)""",
        run_id,
    )
    err = await expect_error(
        sched.GetRunHistory(pb.GetRunHistoryRequest(run_id=str(run_id)), metadata=md),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "HISTORY_TOO_LARGE",
    )
    assert "AWOOOP_MAX_MESSAGE_BYTES" in err.details()
