"""Clients across replicas: two scheduler processes, SDK workers given both addresses
(round_robin with client health checking), one scheduler SIGTERMed under load. Its health
turns NOT_SERVING first, so no new calls go to it; its waiting long-polls end with
UNAVAILABLE/SHUTTING_DOWN, which the channel retries on the other replica. No error reaches
the workers, every run completes once, and the claim rate during the drain stays bounded
(no immediate re-claim loop against the draining replica)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc

from awooop.ingest.v1 import ingest_pb2_grpc
from awooop.worker import RunContext, Worker
from awooop.worker.client import channel_target
from tests.harness.helpers import eventually, key_of, settings_env, spawn_services
from tests.harness.infra import tg_event

PROJECT = "ops"
WORKERS = 10
CLAIM_WAIT = 2.0


def test_a_list_of_addresses_is_one_balanced_target() -> None:
    assert channel_target("127.0.0.1:1,127.0.0.1:2") == "ipv4:127.0.0.1:1,127.0.0.1:2"
    assert channel_target("localhost:5, 127.0.0.1:6").startswith(("ipv4:", "ipv6:"))
    assert channel_target("dns:///scheduler.internal:50052") == "dns:///scheduler.internal:50052"
    assert channel_target("127.0.0.1:50052") == "127.0.0.1:50052"


async def test_a_scheduler_sigtermed_under_load_costs_no_client_error_and_no_claim_storm(
    start_services: Any, make_key: Any, db: Any, settings: Any, tmp_path: Path
) -> None:
    env = settings_env(settings.with_(shutdown_delay=1.0, shutdown_grace=5.0, lease_ttl=30.0))
    a = await spawn_services(["scheduler"], env, tmp_path, "sched-a")
    b = await spawn_services(["scheduler"], env, tmp_path, "sched-b")
    rt = await start_services("ingest")
    ingest_md = await make_key("hook", {PROJECT: ["ingest"]}, "service")
    worker_key = key_of(await make_key("pod", {PROJECT: ["worker"]}, "service"))
    both = f"127.0.0.1:{a.ports['scheduler']},127.0.0.1:{b.ports['scheduler']}"
    handled: list[str] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        handled.append(ctx.run_id)
        await asyncio.sleep(0.05)
        return {"ok": True}

    workers = [
        Worker(
            handler,
            projects=[PROJECT],
            key=worker_key,
            scheduler=both,
            concurrency=2,
            claim_wait=CLAIM_WAIT,
            heartbeat_interval=1.0,
            lease_ttl=30,
        )
        for _ in range(WORKERS)
    ]
    tasks = [asyncio.create_task(w.run(install_signal_handlers=False)) for w in workers]
    ingest = ingest_pb2_grpc.IngestServiceStub(grpc.aio.insecure_channel(f"127.0.0.1:{rt.ports['ingest']}"))
    sent = 0
    stop_sending = asyncio.Event()

    async def producer() -> None:
        nonlocal sent
        while not stop_sending.is_set():
            sent += 1
            await ingest.IngestEvent(tg_event(PROJECT, sent), metadata=ingest_md, timeout=10)
            await asyncio.sleep(0.02)

    producing = asyncio.create_task(producer())
    try:
        await eventually(lambda: _true(len(handled) >= 50), timeout=30, what="load on both replicas")
        claims_before = sum(w.stats.claims_sent for w in workers)
        handled_before = len(handled)
        t0 = time.monotonic()
        rc = await asyncio.to_thread(a.terminate, 30)  # SIGTERM; returns once the process exited
        drain_s = time.monotonic() - t0
        claims_drain = sum(w.stats.claims_sent for w in workers) - claims_before
        handled_drain = len(handled) - handled_before
        # and the survivor carries on alone
        await eventually(
            lambda: _true(len(handled) >= handled_before + handled_drain + 50), timeout=30, what="work after the drain"
        )
        stop_sending.set()
        await asyncio.wait_for(producing, 10)

        async def all_completed() -> bool:
            return bool(
                await db.fetchval("SELECT count(*) = $1 FROM awooop_run_state WHERE status = 'COMPLETED'", sent)
            )

        await eventually(all_completed, timeout=30, what="every run completed")
    finally:
        stop_sending.set()
        for w in workers:
            w.stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        a.kill()
        b.terminate()
    assert rc == 0, a.log()
    claim_errors = sum(w.stats.claim_errors for w in workers)
    attempts = await db.fetchval("SELECT max(attempt_count) FROM awooop_run_state")
    rate = claims_drain / drain_s
    print(
        f"\nreplica drain: {sent} events, drain {drain_s:.1f} s, {claims_drain} ClaimRuns during it "
        f"({rate:.1f}/s for {WORKERS} workers, {handled_drain} runs handled), client-visible claim errors "
        f"{claim_errors}, early empty claims {sum(w.stats.early_empty_claims for w in workers)}"
    )
    assert claim_errors == 0
    assert attempts == 1  # no run was handed out twice
    assert len(handled) == len(set(handled)) == sent
    # bounded: a claim per run handled, plus per worker about one long-poll per half wait and a
    # few retries; an immediate re-claim loop would be hundreds per worker per second
    assert claims_drain <= handled_drain + WORKERS * (drain_s / (CLAIM_WAIT / 2) + 5), rate


async def _true(value: bool) -> bool:
    return value


async def test_the_cli_takes_a_list_of_replicas_and_channel_options(start_services: Any, make_key: Any) -> None:
    import os
    import subprocess
    import sys

    from services.common.embedded import free_port
    from tests.harness.helpers import ROOT

    rt = await start_services("scheduler")
    admin = key_of(await make_key("boss", {PROJECT: ["admin"]}))
    dead = f"127.0.0.1:{free_port()}"  # a replica that is down: round_robin uses the live one
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    env["AWOOOP_API_KEY"] = admin
    cmd = [
        sys.executable,
        "-m",
        "awooop.cli",
        "runs",
        "list",
        "--project",
        PROJECT,
        "--json",
        "--scheduler",
        f"{dead},127.0.0.1:{rt.ports['scheduler']}",
        "--channel-option",
        "grpc.keepalive_time_ms=30000",
    ]
    proc = await asyncio.to_thread(subprocess.run, cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # a DNS name: every address it resolves to is a replica (localhost: 127.0.0.1, and ::1 where
    # nothing listens)
    by_name = [*cmd[: cmd.index("--scheduler") + 1], f"dns:///localhost:{rt.ports['scheduler']}"]
    proc = await asyncio.to_thread(
        subprocess.run, by_name, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    bad = await asyncio.to_thread(
        subprocess.run,
        [*cmd[:-2], "--channel-option", "novalue"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr
