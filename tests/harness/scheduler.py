"""Scheduler test harness: runs inserted as ingest creates them, rows and audit actions read
back, and a scheduler service with keys for every role (`Sched`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
from google.protobuf import duration_pb2
from prometheus_client import REGISTRY

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common.runtime import Runtime
from services.scheduler import approvals, reaper
from services.scheduler.saga_client import SagaNudger
from tests.harness.helpers import eventually

Metadata = tuple[tuple[str, str], ...]


def dur(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def lease(run_id: Any, attempt: int) -> common_pb2.LeaseToken:
    return common_pb2.LeaseToken(run_id=str(run_id), attempt=attempt)


async def insert_runs(db: asyncpg.Connection, project: str, n: int = 1, max_attempts: int = 3) -> list[str]:
    """Runs as the ingest service creates them (one transaction, then the wake-up NOTIFY)."""
    rows = await db.fetch(
        # clock_timestamp(): distinct creation times, so "oldest first" has one right answer
        """INSERT INTO awooop_run_state (project_id, channel_type, input, max_attempts, created_at)
           SELECT $1, 'api', jsonb_build_object('n', g), $3, clock_timestamp() FROM generate_series(1, $2) g
           RETURNING run_id, created_at""",
        project,
        n,
        max_attempts,
    )
    await db.execute("SELECT pg_notify('awooop_run_ready', $1)", project)
    return [str(r["run_id"]) for r in sorted(rows, key=lambda r: r["created_at"])]


async def run_row(db: asyncpg.Connection, run_id: str) -> asyncpg.Record:
    row = await db.fetchrow("SELECT * FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id))
    assert row is not None
    return row


async def audit_actions(db: asyncpg.Connection, run_id: str) -> list[str]:
    rows = await db.fetch("SELECT action FROM awooop_audit_log WHERE run_id = $1 ORDER BY audit_id", uuid.UUID(run_id))
    return [r["action"] for r in rows]


async def add_compensatable_step(db: asyncpg.Connection, run_id: str, project: str, attempt: int = 1) -> None:
    """A completed tool_call step with a compensation command, as the saga service journals it."""
    await db.execute(
        """INSERT INTO awooop_saga_step (run_id, step_id, project_id, seq, step_type, tool_id, status,
                                         compensation_cmd, attempt, completed_at)
           VALUES ($1, 'scale', $2, 1, 'tool_call', 'k8s_scale_deployment', 'completed',
                   '{"tool_id": "k8s_scale_deployment", "params": {"replicas": 1}}', $3, now())""",
        uuid.UUID(run_id),
        project,
        attempt,
    )


async def comp_request(db: asyncpg.Connection, run_id: str) -> asyncpg.Record | None:
    return await db.fetchrow("SELECT * FROM awooop_compensation_request WHERE run_id = $1", uuid.UUID(run_id))


async def expire_lease(db: asyncpg.Connection, run_id: str) -> None:
    """Moves the lease deadline into the past (as if the worker stopped heartbeating long ago)."""
    await db.execute(
        "UPDATE awooop_run_state SET lease_until = now() - interval '1 second' WHERE run_id = $1", uuid.UUID(run_id)
    )


@dataclass
class Sched:
    rt: Runtime
    stub: scheduler_pb2_grpc.SchedulerServiceStub
    db: asyncpg.Connection
    worker: Metadata  # worker in "p"
    approver: Metadata  # approver in "p"
    admin: Metadata  # admin in "p"
    outsider: Metadata  # worker in "q" only
    saga: SagaNudger

    @property
    def pool(self) -> asyncpg.Pool:
        assert self.rt.ctx is not None
        return self.rt.ctx.pool

    async def claim(self, worker_id: str = "w1", md: Metadata | None = None, **kw: Any) -> list[pb.ClaimedRun]:
        kw.setdefault("project_ids", ["p"])
        resp = await self.stub.ClaimRuns(pb.ClaimRunsRequest(worker_id=worker_id, **kw), metadata=md or self.worker)
        return list(resp.runs)

    async def claim_one(self, worker_id: str = "w1", **kw: Any) -> pb.ClaimedRun:
        runs = await self.claim(worker_id, **kw)
        assert len(runs) == 1, runs
        return runs[0]

    async def heartbeat(self, worker_id: str, *leases: common_pb2.LeaseToken, **kw: Any) -> list[pb.LeaseRenewal]:
        md = kw.pop("md", None) or self.worker
        resp = await self.stub.Heartbeat(pb.HeartbeatRequest(worker_id=worker_id, leases=leases, **kw), metadata=md)
        return list(resp.renewals)

    async def reap(self) -> reaper.ReapResult:
        return await reaper.reap(self.pool, self.saga)

    async def expire_approvals(self) -> int:
        return await approvals.expire_approvals(self.pool, self.saga)


_FIRST_PASS = ("scheduler.reaper", "scheduler.approval_sweep")


def _passes(loop: str) -> float:
    """The loop's passes that succeeded (a pass that raised did none of its work)."""
    return REGISTRY.get_sample_value("awooop_background_runs_total", {"loop": loop, "outcome": "ok"}) or 0


async def make_sched(
    start_services: Any, channels: Any, db: asyncpg.Connection, make_key: Any, **overrides: Any
) -> Sched:
    # the loops stay out of the way unless a test shortens them
    overrides.setdefault("reaper_interval", 3600)
    overrides.setdefault("approval_sweep_interval", 3600)
    before = {loop: _passes(loop) for loop in _FIRST_PASS}
    rt = await start_services("scheduler", **overrides)
    # each loop's first pass runs at start-up: once it is over, a run a test puts in place (an
    # expired approval, an expired lease) is left for the test to act on, not taken by that pass

    async def first_passes_done() -> bool:
        return all(_passes(loop) > n for loop, n in before.items())

    await eventually(first_passes_done, what="the scheduler's first reaper and approval-sweep passes")
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    assert rt.ctx is not None
    return Sched(
        rt=rt,
        stub=stub,
        db=db,
        worker=await make_key("worker-1", {"p": ["worker"]}, "service"),
        approver=await make_key("alice", {"p": ["approver"]}),
        admin=await make_key("root", {"p": ["admin"]}),
        outsider=await make_key("mallory", {"q": ["worker", "approver", "admin"]}),
        saga=SagaNudger(rt.ctx.settings),
    )


async def wait_listening(s: Sched) -> None:
    """Waits until the scheduler's LISTEN connection is up (it starts in the background)."""

    async def up() -> bool:
        return bool(
            await s.db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'awooop-scheduler-listen'"
                " AND datname = current_database()"
            )
        )

    await eventually(up, what="the scheduler's LISTEN connection")


async def claims_waiting(n: int) -> bool:
    """At least n long-polling claims are blocked waiting for a wake-up (a real gauge)."""
    return (REGISTRY.get_sample_value("awooop_scheduler_claims_waiting") or 0) >= n


async def snapshot(s: Sched, run_id: str) -> tuple[dict[str, Any], int]:
    row = dict(await run_row(s.db, run_id))
    n = await s.db.fetchval("SELECT count(*) FROM awooop_audit_log WHERE run_id = $1", uuid.UUID(run_id))
    return row, n


async def approval_expired(s: Sched, run_id: str) -> bool:
    """The run's approval token has expired (the sweep may not have failed it yet)."""
    sql = "SELECT approval_expires_at <= now() FROM awooop_run_state WHERE run_id = $1"
    return bool(await s.db.fetchval(sql, uuid.UUID(run_id)))
