"""Seed 000's crash criterion with a real worker process: a worker killed with SIGKILL
mid-run has its run back in PENDING within one reaper interval after its lease expires,
and another worker then claims it with the next fencing token."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid

from google.protobuf.duration_pb2 import Duration

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from tests.harness.helpers import ROOT, eventually
from tests.harness.scheduler import audit_actions, insert_runs, make_sched, run_row

LEASE_TTL = 2.0  # heartbeats every 0.2 s keep it alive even on a loaded machine
REAPER_INTERVAL = 0.5
CI_SLACK = 5.0  # a slow, shared CI machine; the condition, not the sleep, is the assertion


async def test_a_sigkilled_worker_process_has_its_run_back_in_pending(start_services, channels, db, make_key) -> None:
    s = await make_sched(
        start_services, channels, db, make_key, lease_ttl=LEASE_TTL, reaper_interval=REAPER_INTERVAL, retry_backoff=0.5
    )
    (run_id,) = await insert_runs(db, "p", 1)
    key = s.worker[0][1].removeprefix("Bearer ")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "tests" / "worker_proc.py"),
        f"127.0.0.1:{s.rt.ports['scheduler']}",
        key,
        "p",
        "doomed-worker",
        "0.2",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)  # type: ignore[union-attr]
        claimed = json.loads(line)
        assert claimed["run_id"] == run_id and claimed["attempt"] == 1, claimed
        first_deadline = (await run_row(db, run_id))["lease_until"]

        # the worker is alive: its heartbeats keep the run RUNNING past the claim's deadline,
        # through several reaper passes
        async def renewed_past_first_lease() -> bool:
            row = await run_row(db, run_id)
            outlived = await db.fetchval("SELECT now() > $1::timestamptz", first_deadline)
            return row["status"] == "RUNNING" and row["lease_until"] > first_deadline and bool(outlived)

        await eventually(renewed_past_first_lease, timeout=15, what="the worker to outlive its first lease")
        assert (await run_row(db, run_id))["worker_id"] == "doomed-worker"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL

    async def back_in_pending() -> bool:
        row = await run_row(db, run_id)
        return row["status"] == "PENDING"

    # the lease ends at most LEASE_TTL after the kill; the reaper takes it within one interval
    await eventually(back_in_pending, timeout=LEASE_TTL + REAPER_INTERVAL + CI_SLACK, what="the reaper")
    row = await run_row(db, run_id)
    assert row["reaped_at"] is not None and row["worker_id"] is None and row["lease_until"] is None
    assert row["reaped_at"] > row["heartbeat_at"]
    assert await audit_actions(db, run_id) == ["CLAIMED", "REAPED"]
    reap = await db.fetchrow(
        "SELECT actor, details FROM awooop_audit_log WHERE run_id = $1 AND action = 'REAPED'", uuid.UUID(run_id)
    )
    assert reap["actor"] == "system:reaper" and json.loads(reap["details"])["worker_id"] == "doomed-worker"
    # a reaped lease backs off like a retryable failure (the retry policy's first delay)
    assert row["wait_reason"] == "backoff" and row["not_before"] > row["reaped_at"]

    # another worker picks it up with the next fencing token, once the backoff is over
    successor = await s.claim_one("successor", wait=Duration(seconds=10))
    assert successor.run.run_id == run_id and successor.lease.attempt == 2 and successor.resumed
    (o,) = await s.heartbeat("doomed-worker", common_pb2.LeaseToken(run_id=run_id, attempt=1))
    assert o.outcome == pb.LEASE_OUTCOME_LEASE_LOST
