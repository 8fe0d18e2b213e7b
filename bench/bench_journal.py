"""Saga journal write cost vs journal length (issue: "a journal of 1,000 steps still answers
begin/complete without its cost growing with the journal length").

Standalone: creates a scratch database on AWOOOP_DATABASE_URL (else the local
postgresql://postgres@127.0.0.1:5432), migrates it, serves the saga service in-process on an
ephemeral port, and times BeginStep + CompleteStep pairs over real gRPC for runs whose journals
already hold 10, 1,000 and 10,000 steps (pre-filled with one INSERT ... SELECT). Pairs are
measured in interleaved rounds so drift hits every length alike; the figure is the median per
pair, and the ratio is median(length) / median(10). Prints one JSON object; drops the database.

    .venv/bin/python -m bench.bench_journal [--pairs 300] [--lengths 10,1000,10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import grpc
from google.protobuf import struct_pb2

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from services.common import migrate, principals
from services.common.runtime import Runtime
from services.common.settings import Settings

PROJECT = "bench"
PREFILL_SQL = """
INSERT INTO awooop_saga_step (run_id, step_id, project_id, seq, step_type, tool_id, tool_params, status,
                              result, attempt, completed_at)
SELECT $1, 'pre-' || g, $2, g, 'tool_call', 'k8s_scale_deployment', '{"deployment": "api", "replicas": 3}',
       'completed', '{"previous_replicas": 1}', 1, now()
  FROM generate_series(1, $3) g
"""


def _db_url(dsn: str, name: str) -> str:
    p = urlsplit(dsn)
    return urlunsplit((p.scheme, p.netloc, "/" + name, p.query, p.fragment))


async def _pair(saga: Any, md: Any, lease: common_pb2.LeaseToken, step_id: str, result: struct_pb2.Struct) -> float:
    t0 = time.perf_counter()
    await saga.BeginStep(
        saga_pb2.BeginStepRequest(
            lease=lease, step_id=step_id, step_type=common_pb2.STEP_TYPE_TOOL_CALL, tool_id="pg_mutate"
        ),
        metadata=md,
    )
    await saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=lease, step_id=step_id, result=result), metadata=md)
    return time.perf_counter() - t0


async def bench(dsn: str, pairs: int, lengths: list[int]) -> dict[str, Any]:
    name = f"awooop_bench_journal_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(_db_url(dsn, "postgres"))
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = _db_url(dsn, name)
    rt: Runtime | None = None
    try:
        await migrate.migrate(url)
        settings = Settings.from_env().with_(
            database_url=url, redis_url="", metrics_port=0, access_log=False, log_level="WARNING"
        )
        rt = Runtime(settings, ["saga"], port_zero=True)
        await rt.start()
        conn = await asyncpg.connect(url)
        try:
            await principals.create_principal(conn, "bench-worker", "service")
            await principals.grant_role(conn, "bench-worker", PROJECT, "worker")
            key = (await principals.issue_key(conn, "bench-worker")).key
            leases = {}
            for n in lengths:
                run_id = await conn.fetchval(
                    """INSERT INTO awooop_run_state (project_id, channel_type, status, attempt_count, lease_until)
                       VALUES ($1, 'api', 'RUNNING', 1, now() + interval '1 hour') RETURNING run_id""",
                    PROJECT,
                )
                await conn.execute(PREFILL_SQL, run_id, PROJECT, n)
                leases[n] = common_pb2.LeaseToken(run_id=str(run_id), attempt=1)
            await conn.execute("ANALYZE awooop_saga_step")
        finally:
            await conn.close()

        md = (("authorization", f"Bearer {key}"),)
        result = struct_pb2.Struct()
        result.update({"inserted_id": "7c1c", "rows": 1})
        times: dict[int, list[float]] = {n: [] for n in lengths}
        async with grpc.aio.insecure_channel(f"127.0.0.1:{rt.ports['saga']}") as ch:
            saga = saga_pb2_grpc.SagaServiceStub(ch)
            for n in lengths:  # warm up connections and plans (not timed)
                for i in range(20):
                    await _pair(saga, md, leases[n], f"warm-{i}", result)
            rounds, per_round = 10, max(1, pairs // 10)
            for r in range(rounds):
                for n in lengths:
                    for i in range(per_round):
                        times[n].append(await _pair(saga, md, leases[n], f"b-{r}-{i}", result))
        base = statistics.median(times[lengths[0]])
        out: dict[str, Any] = {
            "benchmark": "saga_journal_begin_complete",
            "what": "one BeginStep + CompleteStep pair over gRPC, sequential, in-process saga server",
            "pairs_per_length": rounds * per_round,
            "results": {},
        }
        for n in lengths:
            ts = sorted(times[n])
            med = statistics.median(ts)
            out["results"][str(n)] = {
                "journal_length_before": n,
                "median_ms": round(med * 1000, 3),
                "p95_ms": round(ts[int(len(ts) * 0.95) - 1] * 1000, 3),
                "ratio_to_first": round(med / base, 3),
            }
        return out
    finally:
        if rt is not None:
            await rt.stop(0.2)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=300, help="timed pairs per journal length")
    ap.add_argument("--lengths", default="10,1000,10000", help="journal lengths to compare, first is the base")
    ap.add_argument(
        "--database-url",
        default=os.environ.get("AWOOOP_DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres",
    )
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    print(json.dumps(asyncio.run(bench(args.database_url, args.pairs, lengths)), indent=2))


if __name__ == "__main__":
    main()
