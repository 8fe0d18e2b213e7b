"""Flow control (docs/flow-control.md): the claim statement's cost with runs it must not read,
the lateness of delayed runs, and dispatch latency.

- claim_cost_busy_key: the single-project claim statement (claims.sql ClaimRuns, one project, 10 runs, rolled
  back so every execution sees the same rows) of a project with 1,000 ready runs and 10,000
  parked on a busy concurrency key, against the same statement for a project with the same
  1,000 ready runs and none parked.
- claim_cost_labels: the same single-project claim, by a worker labelled gpu=a100, of a project with
  1,000 ready runs and 10,000 that require gpu=h100, which no worker has (parked by the label sweep,
  workers.sql SweepLabels, run here as the scheduler runs it), against the same claim of PLAIN. The
  JSON also has the claim before the sweep parked them (`unparked_ms`): what parking saves.
- claim_cost_other_backlog: the multi-project claim for two projects where the other holds a
  10,000-run backlog, against the same claim where the other holds 10 runs (so both sides take
  runs from both projects and only the backlog's size differs).
  Both figures: all projects in one database, the two sides of a figure one prepared statement
  timed alternately in rounds with a VACUUM between (see _claim_costs); medians.
- delayed_lateness_p50/p99: a long-polling claim waits; runs are created with not_before a
  moment ahead; lateness = the CLAIMED audit row's time minus not_before (the database clock).
- dispatch_latency_p50/p99: a waiting worker SDK Worker (concurrency 1); one IngestEvent;
  latency = the handler's start minus the IngestEvent call's return (one process, one clock).
  The JSON splits it in two legs at the claim's transaction start (its CLAIMED audit row's
  time): the wake-up (NOTIFY, listener, the scheduler's event loop) and the claim's statement,
  answer and SDK (`legs`).
- dispatch_latency_loaded_p50/p99: the same while another project gets runs through ingest at
  half the claim cycle's throughput (the claims group's drain, measured here first), claimed
  and completed by the claims group's workers, on the same services. The JSON also has the
  server's WAL while sampled (`wal_while_sampled`: bytes and flushes per second, and with
  track_wal_io_timing on a flush's mean time and the share of the window spent flushing), since
  every claim is a commit that waits for its flush.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from awooop.worker import RunContext, Worker
from bench import claims, cpu, env, procs
from bench.config import Config
from bench.ingest import ingest_event
from bench.loadgen import run_processes, split
from bench.report import Figure
from services.common import sql
from services.common.db import MAX_CACHED_STATEMENT
from services.scheduler import claim_answers, claiming, workers_sql
from services.scheduler.workers import Routing

PROJECT = "bench"
MAX_BATCH = 1000  # IngestEvents' limit per call
LOAD = "load"  # the background load's project (its own workers; the waiting worker claims PROJECT)
KEY = "llm:provider-x"
PARKED = 10_000

READY_SQL = """INSERT INTO awooop_run_state (project_id, channel_type, input, created_at)
               SELECT $1, 'api', '{}', now() - interval '1 hour' + g * interval '1 millisecond'
                 FROM generate_series(1, $2) g"""
PARKED_SQL = f"""INSERT INTO awooop_run_state (project_id, channel_type, input, concurrency_keys, not_before,
                                               wait_reason, wait_key)
                 SELECT $1, 'api', '{{}}', ARRAY['{KEY}'], 'infinity', 'key_busy', '{KEY}'
                   FROM generate_series(1, $2)"""


UNROUTABLE_SQL = """INSERT INTO awooop_run_state (project_id, channel_type, input, required_labels, created_at)
                    SELECT $1, 'api', '{}', '{"gpu": "h100"}', now() - interval '2 hours' + g * interval '1 millisecond'
                      FROM generate_series(1, $2) g"""


def _reported(key: str, title: str) -> list[Figure]:
    return [Figure(f"{key}_{p}", f"{title}, {p}", "ms", "report", None, "reported") for p in ("p50", "p99")]


def declare(cfg: Config) -> list[Figure]:
    return [
        Figure(
            "claim_cost_busy_key",
            f"claim statement with {PARKED:,} runs waiting on a busy key",
            "ms",
            "ratio_le",
            1.2,
            "≤ 1.2 ×",
            baseline_label="the same claim of a project with the same ready runs and none waiting",
            baseline_unit="ms",
        ),
        Figure(
            "claim_cost_labels",
            f"claim statement with {PARKED:,} runs waiting for a label no worker has",
            "ms",
            "ratio_le",
            1.2,
            "≤ 1.2 ×",
            baseline_label="the same claim of a project with the same ready runs and none waiting",
            baseline_unit="ms",
        ),
        Figure(
            "claim_cost_other_backlog",
            f"claim for two projects, the other holding a {PARKED:,}-run backlog",
            "ms",
            "ratio_le",
            1.2,
            "≤ 1.2 ×",
            baseline_label="the same claim with 10 runs there",
            baseline_unit="ms",
        ),
        *_reported("delayed_lateness", "delayed run: claimed minus not_before"),
        *_reported("dispatch_latency", "waiting SDK worker, idle: handler start minus IngestEvent returned"),
        *_reported(
            "dispatch_latency_loaded",
            "waiting SDK worker, other runs at half the claim cycle's throughput:"
            " handler start minus IngestEvent returned",
        ),
    ]


# the claim-cost database: PROJECT with ready runs and runs parked on a busy key, PLAIN with the
# same ready runs and nothing parked, and two other projects that differ only in their backlog
PLAIN = "plain"
LABELS = "labels"  # READY ready runs and PARKED that require a label no worker has
SMALL = "other-small"
BIG = "other-big"
READY = 1000


# the claiming worker's routing: labelled, as a GPU worker of a labelled fleet
LABELLED = Routing(labels_json='{"gpu": "a100"}')


def _claim_args(st: sql.Statement, arg: Any) -> tuple[Any, ...]:
    """A claim statement's parameters (no claim id) for the project(s) arg."""
    projects = [arg] if isinstance(arg, str) else arg
    return st.args(
        projects=projects,
        lease_secs=60.0,
        worker_id="bench-w",
        actor="bench",
        **LABELLED.params(),
        **claim_answers.NO_KEY,
        **claiming.NO_COMPLETIONS,
    )


async def _once_ms(conn: asyncpg.Connection, st: sql.Statement, arg: Any) -> float:
    """Milliseconds of one claim statement, in a transaction rolled back after it."""
    tr = conn.transaction()
    await tr.start()
    t0 = time.perf_counter()
    await conn.fetch(st.sql, *_claim_args(st, arg))
    ms = (time.perf_counter() - t0) * 1000
    await tr.rollback()
    return ms


async def _explain(conn: asyncpg.Connection, st: sql.Statement, arg: Any) -> dict[str, Any]:
    """Buffers and rows of one execution (EXPLAIN ANALYZE, rolled back): the work it does."""
    tr = conn.transaction()
    await tr.start()
    try:
        (plan,) = json.loads(
            await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + st.sql, *_claim_args(st, arg))
        )
    finally:
        await tr.rollback()

    def scans(node: dict[str, Any]) -> list[str]:
        here = (
            [f"{node['Node Type']} {node.get('Index Name', '')} rows={node['Actual Rows']}"]
            if "Scan" in node["Node Type"] and "Relation Name" in node
            else []
        )
        return here + [x for child in node.get("Plans", []) for x in scans(child)]

    top = plan["Plan"]
    return {
        "shared_hit": top["Shared Hit Blocks"],
        "shared_read": top["Shared Read Blocks"],
        "scans": scans(top),
        "execution_ms": plan["Execution Time"],
    }


async def _claim_costs(stores: env.Stores, cfg: Config, figures: dict[str, Figure]) -> None:
    """Each figure's two sides are the same prepared statement (so the same plan) on one
    database, timed alternately (the order flipped every round), each round after a VACUUM, so
    the dead rows of the rolled-back claims, the cache and the statistics are the same for both;
    the medians are compared."""
    rounds = 5 if cfg.quick else 15
    per_round = 10 if cfg.quick else 20
    dsn = await stores.create_database("flow_claim")
    conn = await asyncpg.connect(dsn, max_cacheable_statement_size=MAX_CACHED_STATEMENT)  # as the pool: cached
    try:
        for project, n in ((PROJECT, READY), (PLAIN, READY), (SMALL, 10), (BIG, PARKED), (LABELS, READY)):
            await conn.execute(READY_SQL, project, n)
        await conn.execute(PARKED_SQL, PROJECT, PARKED)
        await conn.execute(UNROUTABLE_SQL, LABELS, PARKED)
        await conn.execute("VACUUM ANALYZE awooop_run_state")
        single = claiming.claim_statement(1, 10)
        multi = claiming.claim_statement(2, 10)
        unparked = await _unparked_ms(conn, single)  # before the sweep: the claim reads them one by one
        swept = await workers_sql.sweep_labels(conn, project_id=None, live_secs=60.0, forget_secs=86400.0)
        assert swept is not None and swept["parked"] == PARKED, swept
        await conn.execute("VACUUM ANALYZE awooop_run_state")
        sides: dict[str, tuple[sql.Statement, Any]] = {
            "busy": (single, PROJECT),
            "plain": (single, PLAIN),
            "labels": (single, LABELS),
            "big": (multi, [PLAIN, BIG]),
            "small": (multi, [PLAIN, SMALL]),
        }
        for st, arg in sides.values():  # warm: past asyncpg's five custom plans to the generic one
            for _ in range(10):
                await _once_ms(conn, st, arg)
        times: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(rounds):
            await conn.execute("VACUUM awooop_run_state, awooop_run_event")
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for _ in range(per_round):
                for name in order:
                    times[name].append(await _once_ms(conn, *sides[name]))
        plans = [
            dict(r)
            for r in await conn.fetch(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE '%picked AS%'"
            )
        ]
        explained = {name: await _explain(conn, *side) for name, side in sides.items()}
    finally:
        await conn.close()
    await stores.drop_database(dsn)
    ms = {name: statistics.median(t) for name, t in times.items()}
    repeats = rounds * per_round
    common = {"repeats": repeats, "rounds": rounds, "prepared_plans": plans}
    figures["claim_cost_busy_key"].measured(
        ms["busy"], ms["plain"], **common, explain={"with": explained["busy"], "without": explained["plain"]}
    )
    figures["claim_cost_labels"].measured(
        ms["labels"],
        ms["plain"],
        **common,
        unparked_ms=unparked,
        explain={"with": explained["labels"], "without": explained["plain"]},
    )
    figures["claim_cost_other_backlog"].measured(
        ms["big"], ms["small"], **common, explain={"with": explained["big"], "without": explained["small"]}
    )


async def _unparked_ms(conn: asyncpg.Connection, st: sql.Statement) -> float:
    """The median claim of LABELS while its unroutable runs are not parked yet. The statement's
    text is marked so it is a prepared statement of its own: its plan-cost history (measured
    before the sweep parked 10,000 runs and an ANALYZE raised the plan's cost) would otherwise
    make Postgres plan the figures' statement per call for a few hundred calls, since it compares
    the generic plan with the custom plans' average cost so far."""
    before = dataclasses.replace(st, sql=st.sql + "\n-- before the label sweep", _variants={})
    for _ in range(10):  # warm: past asyncpg's five custom plans to the generic one
        await _once_ms(conn, before, LABELS)
    return statistics.median([await _once_ms(conn, before, LABELS) for _ in range(20)])


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _drain_rate(stores: env.Stores, cfg: Config) -> dict[str, Any]:
    """The claim cycle's throughput: the claims group's drain (16 workers, batch 10) of a queue
    filled beforehand, on its own database and scheduler."""
    n = 2000 if cfg.quick else 6000
    dsn = await stores.create_database("flow_drain")
    await claims.seed_claimable(dsn, n)
    md = await env.bench_key(dsn, claims.PROJECT, ("worker",))
    svc = await procs.spawn("scheduler", procs.service_env(dsn, stores.redis_url, stores.redis_prefix), "flow-drain")
    try:
        result = await claims.drain_awooop(cfg, svc, md, dsn, n)
    finally:
        svc.stop()
    await stores.drop_database(dsn)
    return result


async def _producer(
    sync: Callable[[Any], Awaitable[Any]], address: str, metadata: list[list[str]], rate: float, seconds: float
) -> dict[str, Any]:
    """Load process: IngestEvents into LOAD at `rate` events/s (a batch every 20 ms, paced on
    the start time, so a slow answer is caught up by the next batch) for `seconds`."""
    md = tuple(tuple(m) for m in metadata)
    channel = grpc.aio.insecure_channel(address)
    await channel.channel_ready()
    stub = ingest_pb2_grpc.IngestServiceStub(channel)
    template = ingest_event(ingest_pb2, LOAD, "x")

    async def send(ids: range) -> None:
        batch = []
        for i in ids:
            r = ingest_pb2.IngestEventRequest()
            r.CopyFrom(template)
            r.provider_event_id = f"load-{i}"
            batch.append(r)
        await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=batch), metadata=md, timeout=30)

    await send(range(-10, 0))  # warm: the channel, the service's key cache and statements
    start = await sync(None)
    sent = 0
    while (now := time.monotonic()) < start + seconds:
        due = int(rate * (now - start))
        if due > sent:
            upto = min(due, sent + MAX_BATCH)  # behind by more than a call takes: caught up over several
            await send(range(sent, upto))
            sent = upto
        await asyncio.sleep(0.02)
    elapsed = time.monotonic() - start
    await channel.close()
    return {"sent": sent, "seconds": elapsed, "first": None, "done": 0, "errors": {}, "cpu_s": 0.0}


async def load_process(sync: Callable[[Any], Awaitable[Any]], role: str, **kw: Any) -> dict[str, Any]:
    """One process of the background load: the producer, or claim-cycle workers on LOAD."""
    if role == "producer":
        return await _producer(sync, **kw)
    # a long-poll of 1 s: waiting workers are woken by the ingest's NOTIFY, not by polling
    return await claims.awooop_workers(sync, **kw, project=LOAD, wait_s=1.0)


class _Dispatch:
    """A waiting SDK worker (concurrency 1) on PROJECT; a sample is one IngestEvent and the
    handler's start minus that call's return (one process, one clock)."""

    def __init__(self, ingest: ingest_pb2_grpc.IngestServiceStub, md: Any, key: str, scheduler: str) -> None:
        self.ingest, self.md = ingest, md
        self.started: asyncio.Queue[tuple[str, float, float]] = asyncio.Queue()
        # per sample: run id, IngestEvent returned and handler started (wall clock, the store's
        # clock on this machine), for the breakdown against the run's and the claim's times
        self.walls: list[tuple[str, float, float]] = []

        async def handle(ctx: RunContext) -> dict[str, Any]:
            self.started.put_nowait((ctx.run_id, time.perf_counter(), time.time()))
            return {}

        self.worker = Worker(handle, projects=[PROJECT], key=key, scheduler=scheduler, concurrency=1, claim_wait=20)
        self.template = ingest_event(ingest_pb2, PROJECT, "x")

    async def __aenter__(self) -> _Dispatch:
        self.task = asyncio.create_task(self.worker.run(install_signal_handlers=False))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.worker.stop()
        await self.task

    async def sample(self) -> float:
        await asyncio.sleep(0.05)  # the worker's long-poll is waiting again before the event exists
        req = ingest_pb2.IngestEventRequest()
        req.CopyFrom(self.template)
        req.provider_event_id = uuid.uuid4().hex
        resp = await self.ingest.IngestEvent(req, metadata=self.md, timeout=30)
        returned, returned_wall = time.perf_counter(), time.time()
        run_id, at, at_wall = await asyncio.wait_for(self.started.get(), 30)
        if run_id != resp.outcomes[0].run_id:
            raise RuntimeError(f"the worker started run {run_id}, not the one ingested ({resp.outcomes[0].run_id})")
        self.walls.append((run_id, returned_wall, at_wall))
        return (at - returned) * 1000

    async def breakdown(self, conn: asyncpg.Connection, since: int) -> dict[str, Any]:
        """Where the samples from index `since` on spent their time, p50/p99 in ms of each leg:
        IngestEvent returned -> the claim's transaction began (the NOTIFY, the scheduler's
        listener and event loop) and -> the handler started (the claim statement, the answer,
        the SDK). One machine: the store's clock is the client's."""
        walls = self.walls[since:]
        rows = await conn.fetch(
            """SELECT run_id::text AS run_id, extract(epoch FROM created_at)::float8 AS claimed
                 FROM awooop_audit_log WHERE action = 'CLAIMED' AND run_id = ANY($1::uuid[])""",
            [w[0] for w in walls],
        )
        claimed = {r["run_id"]: r["claimed"] for r in rows}
        to_claim = [(claimed[r] - ret) * 1000 for r, ret, _ in walls if r in claimed]
        to_handler = [(at - claimed[r]) * 1000 for r, _, at in walls if r in claimed]
        if not to_claim:
            return {}
        return {
            "ingest_returned_to_claim_began_ms": {"p50": statistics.median(to_claim), "p99": _pct(to_claim, 0.99)},
            "claim_began_to_handler_ms": {"p50": statistics.median(to_handler), "p99": _pct(to_handler, 0.99)},
        }

    async def samples(self, n: int, until: float = float("inf")) -> list[float]:
        """n samples, or those that end before the monotonic time `until`."""
        out: list[float] = []
        while len(out) < n and time.monotonic() < until:
            out.append(await self.sample())
        return out


async def _loaded(
    dispatch: _Dispatch,
    conn: asyncpg.Connection,
    cfg: Config,
    svc: procs.Service,
    ing: procs.Service,
    md_load: Any,
    rate: float,
    samples: int,
) -> tuple[list[float], dict[str, Any]]:
    """Dispatch samples while LOAD gets `rate` runs/s through ingest, claimed and completed by
    the claims group's workers (cfg.claim_workers over cfg.processes) on the same services."""
    warmup = 1.0 if cfg.quick else 2.0
    seconds = warmup + samples * 0.15 + 2.0  # a sample takes ~0.1 s under this load: most fit
    meta = [list(m) for m in md_load]
    kwargs: list[dict[str, Any]] = [
        {"role": "producer", "address": ing.address, "metadata": meta, "rate": rate, "seconds": seconds}
    ] + [
        {
            "role": "workers",
            "address": svc.address,
            "metadata": meta,
            "proc_idx": i,
            "workers": w,
            "batch": cfg.claim_batch,
            "seconds": seconds,
        }
        for i, w in enumerate(split(cfg.claim_workers, cfg.processes))
    ]
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    at: list[float] = []

    def go(_: list[Any]) -> float:  # in run_processes' thread, once every load process is ready
        at.append(time.monotonic() + 0.05)
        loop.call_soon_threadsafe(started.set)
        return at[0]

    load = asyncio.ensure_future(
        asyncio.to_thread(run_processes, "bench.flow:load_process", kwargs, go, timeout=seconds + 60)
    )
    await started.wait()
    await asyncio.sleep(at[0] + warmup - time.monotonic())
    wal0 = await _wal_stats(conn)
    snap0, t0 = cpu.snapshot(svc.pid), time.monotonic()
    out = await dispatch.samples(samples, until=at[0] + seconds - 1.0)  # the last ends inside the load
    t1 = time.monotonic()
    cores = cpu.cores(snap0, cpu.snapshot(svc.pid), t1 - t0)
    wal = _wal(wal0, await _wal_stats(conn), t1 - t0)
    results = await load
    producer, workers = results[0], results[1:]
    if t1 > at[0] + seconds:
        raise RuntimeError("the dispatch samples outlasted the background load")
    return out, {
        "samples": len(out),
        "rate_asked": round(rate, 1),
        "ingested_per_s": round(producer["sent"] / producer["seconds"], 1),
        "completed_per_s": round(sum(r["done"] for r in workers) / seconds, 1),
        "load_errors": {k: v for r in workers for k, v in r["errors"].items()},
        "cpu_cores_while_sampled": cores,
        "wal_while_sampled": wal,
    }


# the server's WAL writes and flushes (every database: the machine's own Postgres may serve others)
WAL_STATS = """SELECT wal_bytes::float8 AS bytes, wal_sync::float8 AS syncs, wal_sync_time AS sync_ms,
                     current_setting('track_wal_io_timing')::bool AS timed FROM pg_stat_wal"""


async def _wal_stats(conn: asyncpg.Connection) -> asyncpg.Record | None:
    try:
        return await conn.fetchrow(WAL_STATS)
    except asyncpg.exceptions.UndefinedTableError:  # before PostgreSQL 14
        return None


def _wal(before: asyncpg.Record | None, after: asyncpg.Record | None, seconds: float) -> dict[str, float | None]:
    """The WAL flushes a window cost every commit in it: bytes and flushes per second, and (with
    track_wal_io_timing on) each flush's mean time and the share of the window a flush was running."""
    if before is None or after is None:
        return {}
    syncs = after["syncs"] - before["syncs"]
    sync_ms = after["sync_ms"] - before["sync_ms"] if after["timed"] else None
    return {
        "bytes_per_s": round((after["bytes"] - before["bytes"]) / seconds),
        "flushes_per_s": round(syncs / seconds, 1),
        "ms_per_flush": round(sync_ms / syncs, 2) if sync_ms is not None and syncs else None,
        "flushing_share": round(sync_ms / 1000 / seconds, 2) if sync_ms is not None else None,
    }


async def _latencies(stores: env.Stores, cfg: Config, figures: dict[str, Figure]) -> None:
    samples = 20 if cfg.quick else 200
    drained = await _drain_rate(stores, cfg)
    dsn = await stores.create_database("flow_latency")
    md = await env.bench_key(dsn, PROJECT, ("worker", "ingest"))
    md_load = await env.bench_key(dsn, LOAD, ("worker", "ingest"))
    base = procs.service_env(dsn, stores.redis_url, stores.redis_prefix)
    svc = await procs.spawn("scheduler", base, "flow")
    ing = await procs.spawn("ingest", base, "flow")
    conn = await asyncpg.connect(dsn)
    try:
        async with grpc.aio.insecure_channel(svc.address) as sch, grpc.aio.insecure_channel(ing.address) as ich:
            sched = scheduler_pb2_grpc.SchedulerServiceStub(sch)
            ingest = ingest_pb2_grpc.IngestServiceStub(ich)
            key = dict(md)["authorization"].removeprefix("Bearer ")
            async with _Dispatch(ingest, md, key, svc.address) as dispatch:
                await dispatch.samples(5)  # warm: channels, the services' key caches and statements
                idle = await dispatch.samples(samples)
                idle_legs = await dispatch.breakdown(conn, 5)
                since = len(dispatch.walls)
                loaded, load = await _loaded(dispatch, conn, cfg, svc, ing, md_load, drained["per_s"] / 2, samples)
                load["legs"] = await dispatch.breakdown(conn, since)
            claim = scheduler_pb2.ClaimRunsRequest(
                worker_id="bench", project_ids=[PROJECT], max_runs=1, wait=Duration(seconds=10)
            )
            late = []
            for _ in range(samples):
                waiting = asyncio.ensure_future(sched.ClaimRuns(claim, metadata=md))
                await asyncio.sleep(0.05)  # the claim is waiting before the run exists
                nb = Timestamp()
                nb.FromNanoseconds(time.time_ns() + 300_000_000)
                req = ingest_pb2.CreateRunRequest(project_id=PROJECT, idempotency_key=uuid.uuid4().hex, not_before=nb)
                await ingest.CreateRun(req, metadata=md)
                (c,) = (await waiting).runs
                await sched.CompleteRun(scheduler_pb2.CompleteRunRequest(lease=c.lease), metadata=md)
                # the claim's time (its transaction's now(), the database clock on this machine)
                claimed = await conn.fetchval(
                    "SELECT extract(epoch FROM created_at)::float8 FROM awooop_audit_log"
                    " WHERE run_id = $1 AND action = 'CLAIMED'",
                    uuid.UUID(c.run.run_id),
                )
                late.append((float(claimed) - (nb.seconds + nb.nanos / 1e9)) * 1000)
    finally:
        await conn.close()
        svc.stop()
        ing.stop()
    await stores.drop_database(dsn)
    load["claim_drain_per_s"] = round(drained["per_s"], 1)
    load["claim_drain"] = drained
    for key, values, extra in (
        ("dispatch_latency", idle, {"legs": idle_legs}),
        ("dispatch_latency_loaded", loaded, load),
        ("delayed_lateness", late, {}),
    ):
        extra = {"samples": len(values), **extra}
        figures[f"{key}_p50"].measured(statistics.median(values), **extra)
        figures[f"{key}_p99"].measured(_pct(values, 0.99), **extra)


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> None:
    by_key = {f.key: f for f in figures}
    await _claim_costs(stores, cfg, by_key)
    await _latencies(stores, cfg, by_key)
