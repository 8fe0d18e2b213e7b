"""Worker SIGKILL -> the run claimed again, with real processes throughout.

A scheduler process runs with a short lease TTL and reaper interval. Per trial: one PENDING
run; worker A (its own process) claims it and heartbeats every 0.2 s, printing a line after
each renewal; worker B (another process) long-polls ClaimRuns. Right after one of A's
renewals the harness SIGKILLs A (so the lease has nearly its whole TTL left: the worst case
for the TTL term) and B reports the moment its ClaimRuns returns the run. The figure is the
median of kill -> reclaim; the baseline is lease TTL + reaper interval, the longest the
reaper alone can need; the target allows 1 s more (NOTIFY wake-up, scheduling, claim). The
scheduler runs with AWOOOP_RETRY_BACKOFF=0: a reaped lease otherwise waits out the retry
policy's backoff (docs/flow-control.md) before it is claimable, which is policy, not latency.

Worker processes are `python -m bench.crash worker ...` (see the bottom of this file).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

import asyncpg

from bench import env, procs, rss
from bench.config import Config
from bench.report import Figure

PROJECT = "bench"


def declare(cfg: Config) -> list[Figure]:
    base = cfg.crash_lease_ttl + cfg.crash_reaper_interval
    return [
        Figure(
            "crash_reclaim",
            "worker SIGKILL → run claimed again",
            "s",
            "le_baseline_plus",
            1.0,
            f"≤ baseline + 1 s ({base + 1:.1f} s)",
            baseline_label=f"lease TTL {cfg.crash_lease_ttl:g} s + reaper interval {cfg.crash_reaper_interval:g} s",
            baseline_unit="s",
        )
    ]


# ---------------------------------------------------------------- worker processes


async def worker_main(role: str, address: str, key: str, worker_id: str) -> None:
    import grpc
    from google.protobuf import duration_pb2

    from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

    md = (("authorization", f"Bearer {key}"),)
    async with grpc.aio.insecure_channel(address) as ch:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)
        await ch.channel_ready()
        print(json.dumps({"event": "ready"}), flush=True)
        wait = duration_pb2.Duration(seconds=30)
        while True:
            r = await stub.ClaimRuns(
                scheduler_pb2.ClaimRunsRequest(worker_id=worker_id, project_ids=[PROJECT], max_runs=1, wait=wait),
                metadata=md,
                timeout=40,
            )
            if r.runs:
                break
        now = time.monotonic()
        run = r.runs[0]
        print(
            json.dumps({"event": "claimed", "at": now, "run_id": run.run.run_id, "attempt": run.lease.attempt}),
            flush=True,
        )
        if role == "B":  # the successor finishes the run, so the next trial starts clean
            await stub.CompleteRun(scheduler_pb2.CompleteRunRequest(lease=run.lease), metadata=md, timeout=10)
            print(json.dumps({"event": "completed", "at": time.monotonic()}), flush=True)
            return
        while True:  # A: heartbeat until killed
            await stub.Heartbeat(
                scheduler_pb2.HeartbeatRequest(worker_id=worker_id, leases=[run.lease]), metadata=md, timeout=5
            )
            print(json.dumps({"event": "renewed", "at": time.monotonic()}), flush=True)
            await asyncio.sleep(0.2)


class _Worker:
    def __init__(self, role: str, address: str, key: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.crash", "worker", role, address, key, f"crash-{role}-{os.getpid()}"],
            cwd=procs.ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    async def next_event(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"crash worker ended: {err[-2000:]}")
        return dict(json.loads(line))

    async def expect(self, event: str, timeout: float) -> dict[str, Any]:
        while True:
            got = await self.next_event(timeout)
            if got["event"] == event:
                return got

    async def fresh(self, event: str, timeout: float) -> dict[str, Any]:
        """The next `event` emitted from now on (older lines waiting in the pipe are skipped)."""
        while True:
            got = await self.expect(event, timeout)
            if got["at"] >= time.monotonic() - 0.02:
                return got

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


async def _trial(address: str, key: str, dsn: str) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        run_id = await conn.fetchval(
            "INSERT INTO awooop_run_state (project_id, channel_type, input) VALUES ($1, 'api', '{}') RETURNING run_id",
            PROJECT,
        )
    finally:
        await conn.close()
    a = _Worker("A", address, key)
    b: _Worker | None = None
    try:
        claimed = await a.expect("claimed", 30)
        if claimed["run_id"] != str(run_id):
            raise RuntimeError("worker A claimed another run")
        await a.expect("renewed", 10)
        b = _Worker("B", address, key)
        await b.expect("ready", 30)
        await asyncio.sleep(0.3)  # B is inside its long-poll now
        await a.fresh("renewed", 10)
        killed_at = time.monotonic()
        a.kill()
        got = await b.expect("claimed", 60)
        if got["run_id"] != str(run_id) or got["attempt"] != claimed["attempt"] + 1:
            raise RuntimeError(f"worker B claimed {got}, expected run {run_id} attempt {claimed['attempt'] + 1}")
        await b.expect("completed", 10)
        return {"seconds": got["at"] - killed_at, "run_id": str(run_id), "attempt": got["attempt"]}
    finally:
        a.kill()
        if b is not None:
            b.kill()


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    (fig,) = figures
    dsn = await stores.create_database("crash")
    key_md = await env.bench_key(dsn, PROJECT, ("worker",))
    key = key_md[0][1].removeprefix("Bearer ")
    svc = await procs.spawn(
        "scheduler",
        procs.service_env(
            dsn,
            stores.redis_url,
            stores.redis_prefix,
            lease_ttl=cfg.crash_lease_ttl,
            reaper_interval=cfg.crash_reaper_interval,
            # a reaped lease backs off by the retry policy (5 s by default) before the run is
            # claimable again: a choice of policy, not latency, so the figure measures without it
            retry_backoff=0,
        ),
        tag="crash",
    )
    try:
        trials = [await _trial(svc.address, key, dsn) for _ in range(cfg.crash_trials)]
        rss.record("scheduler", svc, "after the crash trials")
    finally:
        svc.stop()
        with contextlib.suppress(Exception):
            await stores.drop_database(dsn)
    secs = [t["seconds"] for t in trials]
    fig.measured(
        statistics.median(secs),
        cfg.crash_lease_ttl + cfg.crash_reaper_interval,
        trials=trials,
        max_s=max(secs),
        lease_ttl_s=cfg.crash_lease_ttl,
        reaper_interval_s=cfg.crash_reaper_interval,
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["worker"])
    p.add_argument("role", choices=["A", "B"])
    p.add_argument("address")
    p.add_argument("key")
    p.add_argument("worker_id")
    a = p.parse_args()
    asyncio.run(worker_main(a.role, a.address, a.key, a.worker_id))
