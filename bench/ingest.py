"""Ingest figures: unique and duplicate events/s through IngestEvent against the gRPC
transport ceiling, batch ingest against the service's own insert statement run raw over
asyncpg, and the concurrency sweep behind the plot.

Fairness: the ceiling (health Check) and IngestEvent run through the same load generator,
processes, channels and concurrency, against the same server process, in interleaved rounds.
The raw-SQL baseline calls the service's own store function (services.ingest.store.ingest(),
one StoreEvents statement per batch) on its own fresh database, with the same batches and
concurrency. The bulk API figure sends 128 API-channel events (seed 003's per-principal keys)
and 128 Telegram events per IngestEvents call to the same server, alternating calls, one in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import time
from typing import Any

from bench import cpu, env, procs, rss
from bench.config import Config
from bench.loadgen import HealthCheck, LoadResult, Unexpected, run_load
from bench.report import Figure

PROJECT = "bench"
# the bulk API figure: events per IngestEvents call, and alternating call pairs measured
API_BATCH = 128
API_PAIRS, API_PAIRS_QUICK = 40, 12
API_WARMUP_PAIRS = 3
PAYLOAD = {"message": {"chat": {"id": 4242, "type": "private"}, "text": "deploy web-7 finished", "date": 1760000000}}


def ingest_event(pb: Any, project_id: str, event_id: str) -> Any:
    from google.protobuf import struct_pb2

    from awooop.common.v1 import common_pb2

    payload = struct_pb2.Struct()
    payload.update(PAYLOAD)
    return pb.IngestEventRequest(
        project_id=project_id,
        # a channel-dedupe channel: API-channel events take seed 003's per-principal key table
        # (docs/channels.md), which the bulk API figure measures
        channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM,
        provider_event_id=event_id,
        payload=payload,
    )


class _IngestCaller:
    def __init__(self, address: str, metadata: list[tuple[str, str]], project_id: str = PROJECT, **kw: Any) -> None:
        self.address = address
        self.metadata = tuple(tuple(m) for m in metadata)
        self.project_id = project_id
        self.kw = kw

    async def setup(self, proc_idx: int, workers: int) -> None:
        import grpc

        from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc

        self.pb = ingest_pb2
        self.proc_idx = proc_idx
        self.channel = grpc.aio.insecure_channel(self.address)
        await self.channel.channel_ready()
        self.stub = ingest_pb2_grpc.IngestServiceStub(self.channel)
        # one template request; each call only swaps the id (building Structs is client CPU)
        self.template = ingest_event(ingest_pb2, self.project_id, "x")

    def request(self, event_id: str) -> Any:
        r = self.pb.IngestEventRequest()
        r.CopyFrom(self.template)
        r.provider_event_id = event_id
        return r

    async def close(self) -> None:
        await self.channel.close()


class UniqueIngest(_IngestCaller):
    """IngestEvent with an id never seen before: dedupe insert + run insert in Postgres."""

    async def call(self, worker: int, n: int) -> int:
        r = await self.stub.IngestEvent(
            self.request(f"{self.kw['label']}-{self.proc_idx}-{worker}-{n}"), metadata=self.metadata, timeout=30
        )
        if r.outcomes[0].duplicate:
            raise Unexpected("a fresh event id was answered as a duplicate")
        return 1


class DuplicateIngest(_IngestCaller):
    """IngestEvent with an id ingested before: the Redis fast path answers it."""

    async def call(self, worker: int, n: int) -> int:
        ids: list[str] = self.kw["ids"]
        i = (self.proc_idx * 7919 + worker * 104729 + n) % len(ids)
        r = await self.stub.IngestEvent(self.request(ids[i]), metadata=self.metadata, timeout=30)
        if not r.outcomes[0].duplicate:
            raise Unexpected("a known event id was not answered as a duplicate")
        return 1


class BatchIngest(_IngestCaller):
    """IngestEvents with `batch` fresh events per call."""

    async def call(self, worker: int, n: int) -> int:
        size: int = self.kw["batch"]
        prefix = f"{self.kw['label']}-{self.proc_idx}-{worker}-{n}"
        req = self.pb.IngestEventsRequest(events=[self.request(f"{prefix}-{i}") for i in range(size)])
        r = await self.stub.IngestEvents(req, metadata=self.metadata, timeout=60)
        if len(r.results) != size or any(x.outcomes[0].duplicate for x in r.results):
            raise Unexpected("batch answer does not match the batch")
        return size


class SqlBatch:
    """The raw-store baseline: the ingest service's own store call, services.ingest.store.ingest(),
    which runs StoreEvents (dedupe rows, runs and audit rows for the whole batch in ONE
    statement) for `batch` fresh events, straight over asyncpg with one connection per
    in-flight statement: no gRPC, no protobuf, no validation, no auth, no Redis."""

    def __init__(self, dsn: str, label: str, batch: int, project_id: str = PROJECT) -> None:
        self.dsn, self.label, self.batch, self.project_id = dsn, label, batch, project_id

    async def setup(self, proc_idx: int, workers: int) -> None:
        import asyncpg

        from services.common.db import StoreConnection, _init_connection
        from services.ingest import store
        from services.ingest.parsing import NewEvent

        self.store, self.new_event = store, NewEvent
        self.proc_idx = proc_idx
        self.input_json = json.dumps(PAYLOAD, separators=(",", ":"))
        # the service's connection class and set-up (codecs), without its pool's other settings
        self.pool = await asyncpg.create_pool(
            self.dsn, min_size=workers, max_size=workers, init=_init_connection, connection_class=StoreConnection
        )

    async def call(self, worker: int, n: int) -> int:
        prefix = f"{self.label}-{self.proc_idx}-{worker}-{n}"
        events = [
            self.new_event(
                project_id=self.project_id,
                channel="telegram",
                provider_event_id=f"{prefix}-{i}",
                input_json=self.input_json,
                max_attempts=3,
            )
            for i in range(self.batch)
        ]
        stored = await self.store.ingest(
            self.pool, events, principal_id="bench", actor="service:bench", retention=7 * 24 * 3600.0
        )
        created = sum(1 for s in stored if s.created)
        if created != self.batch:
            raise Unexpected(f"raw insert created {created} runs for {self.batch} events")
        return self.batch

    async def close(self) -> None:
        await self.pool.close()


async def _load(
    kind: type,
    params: dict[str, Any],
    cfg: Config,
    concurrency: int,
    server: procs.Service | None = None,
    duration: float | None = None,
) -> LoadResult:
    return await asyncio.to_thread(
        run_load,
        f"bench.ingest:{kind.__name__}" if kind is not HealthCheck else "bench.loadgen:HealthCheck",
        params,
        concurrency=concurrency,
        processes=cfg.processes,
        duration=duration or cfg.duration,
        warmup=max(1.0, cfg.warmup) if duration else cfg.warmup,
        server_pid=server.pid if server else None,
    )


def _median(results: list[LoadResult]) -> LoadResult:
    """The round with the median rate (the upper one of two)."""
    return sorted(results, key=lambda r: r.units_per_s)[len(results) // 2]


async def _preingest(svc: procs.Service, metadata: Any, label: str, count: int) -> list[str]:
    """Ingests `count` ids and sends each once more, so the duplicate run starts warm."""
    import grpc

    from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc

    ids = [f"{label}-{i}" for i in range(count)]
    async with grpc.aio.insecure_channel(svc.address) as ch:
        stub = ingest_pb2_grpc.IngestServiceStub(ch)
        sem = asyncio.Semaphore(16)

        async def one(event_id: str) -> bool:
            async with sem:
                r = await stub.IngestEvent(ingest_event(ingest_pb2, PROJECT, event_id), metadata=metadata, timeout=30)
                return r.outcomes[0].duplicate

        try:
            first = await asyncio.gather(*(one(i) for i in ids))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise NotImplementedError(f"IngestEvent: {exc.details()}") from None
            raise
        again = await asyncio.gather(*(one(i) for i in ids))
    if any(first) or not all(again):
        raise RuntimeError("pre-ingest: first arrivals must be new and second arrivals duplicates")
    return ids


async def _redis_keys(stores: env.Stores) -> int:
    import redis.asyncio as aioredis

    client = aioredis.from_url(stores.redis_url)
    try:
        return len([k async for k in client.scan_iter(match=stores.redis_prefix + "*", count=1000)])
    finally:
        await client.aclose()


def _sample(metrics: dict[str, float], name: str, **labels: str) -> float:
    """A scraped sample by its name and labels, whichever order the exposition wrote them in."""
    want = {f'{k}="{v}"' for k, v in labels.items()}
    for key, value in metrics.items():
        metric, _, rest = key.partition("{")
        if metric == name and set(rest.rstrip("}").split(",")) == want:
            return value
    return 0.0


def _duplicates(
    fig: Figure, d: LoadResult, ceiling: LoadResult, rounds: dict[str, list[float]], metrics: dict[str, float], via: str
) -> None:
    """Fills a duplicate figure; notes when the fast path it names did not answer (nearly) all."""
    hits = _sample(metrics, "awooop_ingest_dedupe_answers_total", channel="telegram", path=via, answer="duplicate")
    dups = _sample(metrics, "awooop_ingest_events_total", channel="telegram", outcome="duplicate")
    fig.measured(
        d.units_per_s,
        ceiling.calls_per_s,
        run=d.as_dict(),
        ceiling=ceiling.as_dict(),
        rounds=rounds,
        # duplicates the service answered by the fast path this figure names, over all it answered
        fast_path_share=round(hits / dups, 4) if dups else None,
        service_metrics=metrics,
    )
    fig.details["bound"] = cpu.bound(d.cpu, os.cpu_count() or 1)
    if d.errors or d.unexpected:
        fig.note = f"{sum(d.errors.values())} errors, {d.unexpected} unexpected: {d.first_error}"
    elif dups and hits / dups < 0.99:
        fig.note = f"only {hits / dups:.1%} of duplicates were answered from {via}"


def _per_unit_us(r: LoadResult) -> dict[str, float]:
    """CPU microseconds per unit (event or call) of each measured process group, and the client's."""
    if not r.units_per_s:
        return {}
    out = {k: round(v / r.units_per_s * 1e6, 1) for k, v in r.cpu.items() if k != "machine"}
    out["client"] = round(r.client_cpu / r.units_per_s * 1e6, 1)
    return out


def _fast_path_metrics(svc: procs.Service) -> dict[str, float]:
    """The ingest service's counters (non-zero, without the *_created timestamps)."""
    return {
        k: v
        for k, v in procs.scrape_metrics(svc).items()
        if k.startswith("awooop_ingest") and "_created" not in k and v
    }


async def _api_batch(stores: env.Stores, cfg: Config, fig: Figure) -> None:
    """IngestEvents with API_BATCH fresh API-channel keys against the same call with API_BATCH fresh
    Telegram ids, on one server, alternating calls (one in flight), so drift hits both alike;
    the figure is the median API call's seconds over the median Telegram call's."""
    import grpc
    from google.protobuf import struct_pb2

    from awooop.common.v1 import common_pb2
    from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc

    dsn = await stores.create_database("ingest_api")
    svc = await procs.spawn("ingest", procs.service_env(dsn, stores.redis_url, stores.redis_prefix + "a:"))
    try:
        md = await env.bench_key(dsn, PROJECT, ("ingest",))
        payload = struct_pb2.Struct()
        payload.update(PAYLOAD)
        label = secrets.token_hex(3)

        def batch(channel: int, call: int) -> Any:
            return ingest_pb2.IngestEventsRequest(
                events=[
                    ingest_pb2.IngestEventRequest(
                        project_id=PROJECT,
                        channel_type=channel,
                        provider_event_id=f"{label}-{call}-{i}",
                        payload=payload,
                    )
                    for i in range(API_BATCH)
                ]
            )

        seconds: dict[str, list[float]] = {"api": [], "telegram": []}
        channels = {"api": common_pb2.CHANNEL_TYPE_API, "telegram": common_pb2.CHANNEL_TYPE_TELEGRAM}
        pairs = API_PAIRS_QUICK if cfg.quick else API_PAIRS
        async with grpc.aio.insecure_channel(svc.address) as ch:
            stub = ingest_pb2_grpc.IngestServiceStub(ch)
            for n in range(API_WARMUP_PAIRS + pairs):
                # the order within a pair alternates too: neither kind always follows the other
                order = ("api", "telegram") if n % 2 else ("telegram", "api")
                for kind in order:
                    req = batch(channels[kind], n)
                    start = time.perf_counter()
                    r = await stub.IngestEvents(req, metadata=md, timeout=60)
                    took = time.perf_counter() - start
                    fresh = [o for x in r.results for o in x.outcomes if not o.duplicate]
                    if len(r.results) != API_BATCH or len(fresh) != API_BATCH:
                        raise RuntimeError(f"{kind} batch: {len(fresh)} new runs for {API_BATCH} fresh events")
                    if n >= API_WARMUP_PAIRS:
                        seconds[kind].append(took)
        api, tg = statistics.median(seconds["api"]), statistics.median(seconds["telegram"])
        fig.measured(
            api,
            tg,
            pairs=pairs,
            events_per_call=API_BATCH,
            api_ms={"p50": round(api * 1000, 2), "max": round(max(seconds["api"]) * 1000, 2)},
            telegram_ms={"p50": round(tg * 1000, 2), "max": round(max(seconds["telegram"]) * 1000, 2)},
            api_calls_ms=[round(x * 1000, 2) for x in seconds["api"]],
            telegram_calls_ms=[round(x * 1000, 2) for x in seconds["telegram"]],
        )
        rss.record("ingest", svc, f"after bulk API ingest ({API_BATCH} per call)")
    finally:
        svc.stop()


def declare(cfg: Config) -> list[Figure]:
    unique = Figure(
        "ingest_unique",
        "unique events/s, IngestEvent",
        "events/s",
        "ratio_ge",
        0.6,
        "≥ 0.6 ×",
        baseline_label=f"health Check calls/s, same client, {cfg.table_concurrency} in flight",
        baseline_unit="calls/s",
    )
    dup = Figure(
        "ingest_duplicate",
        "duplicate events/s (Redis fast path: the process's memory of recent ids off)",
        "events/s",
        "ratio_ge",
        0.9,
        "≥ 0.9 ×",
        baseline_label="health Check calls/s on that server, same client and concurrency",
        baseline_unit="calls/s",
    )
    dup_memory = Figure(
        "ingest_duplicate_memory",
        "duplicate events/s (answered from the process's memory of recent ids, the default)",
        "events/s",
        "ratio_ge",
        0.9,
        "≥ 0.9 ×",
        baseline_label="same transport ceiling as unique",
        baseline_unit="calls/s",
    )
    batch = Figure(
        "ingest_batch",
        f"events/s, IngestEvents (batches of {cfg.batch_size})",
        "events/s",
        "ratio_ge",
        0.5,
        "≥ 0.5 ×",
        baseline_label=f"the service's own insert, raw over asyncpg, {cfg.batch_concurrency} in flight",
        baseline_unit="events/s",
    )
    api_batch = Figure(
        "ingest_api_batch",
        f"seconds per IngestEvents call, {API_BATCH} API-channel events (seed 003 keys)",
        "s",
        "ratio_le",
        3.0,
        "≤ 3 ×",
        baseline_label=f"the same call with {API_BATCH} Telegram events, same server, alternating calls",
        baseline_unit="s",
    )
    return [unique, dup, dup_memory, batch, api_batch]


async def run(
    stores: env.Stores, cfg: Config, figures: list[Figure], sweep: dict[str, list[dict[str, Any]]]
) -> list[Figure]:
    unique, dup, dup_memory, batch, api_batch = figures
    label = secrets.token_hex(3)
    sweep.setdefault("health Check (transport ceiling)", [])
    sweep.setdefault("IngestEvent, unique ids", [])
    sweep.setdefault("IngestEvent, duplicates (process memory)", [])
    services: list[procs.Service] = []
    try:
        dsn = await stores.create_database("ingest")
        svc_env = procs.service_env(dsn, stores.redis_url, stores.redis_prefix)
        svc = await procs.spawn("ingest", svc_env)
        services.append(svc)
        md = await env.bench_key(dsn, PROJECT, ("ingest",))
        base = {"address": svc.address, "metadata": [list(m) for m in md]}
        by_c: dict[int, dict[str, LoadResult]] = {}
        rounds_at: dict[str, list[float]] = {}
        dup_ids: list[str] | None = None
        unimplemented = ""
        for c in cfg.concurrencies:
            # the table's point is measured in interleaved rounds (ceiling, unique, duplicate,
            # again): drift of the machine hits all three alike, and each figure is the median round
            rounds = cfg.table_rounds if c == cfg.table_concurrency else 1
            got: dict[str, list[LoadResult]] = {"health": [], "unique": [], "dup": []}
            for r in range(rounds):
                got["health"].append(await _load(HealthCheck, {"address": svc.address}, cfg, c, svc))
                if unimplemented:
                    continue
                try:
                    got["unique"].append(await _load(UniqueIngest, {**base, "label": f"{label}-u{c}-{r}"}, cfg, c, svc))
                    if dup_ids is None:
                        dup_ids = await _preingest(svc, md, f"{label}-d", cfg.duplicate_ids)
                    got["dup"].append(await _load(DuplicateIngest, {**base, "ids": dup_ids}, cfg, c, svc))
                except NotImplementedError as exc:
                    unimplemented = str(exc)
            point = {k: _median(v) for k, v in got.items() if v}
            if rounds > 1:
                rounds_at = {k: [round(x.units_per_s, 1) for x in v] for k, v in got.items()}
            for k, series in (
                ("health", "health Check (transport ceiling)"),
                ("unique", "IngestEvent, unique ids"),
                ("dup", "IngestEvent, duplicates (process memory)"),
            ):
                if k in point:
                    sweep[series].append(point[k].as_dict())
            by_c[c] = point
        tc = cfg.table_concurrency
        table = by_c.get(tc) or by_c[max(by_c)]
        ceiling = table["health"]
        if "unique" in table:
            u = table["unique"]
            unique.measured(
                u.units_per_s, ceiling.calls_per_s, run=u.as_dict(), ceiling=ceiling.as_dict(), rounds=rounds_at
            )
            unique.details["bound"] = cpu.bound(u.cpu, os.cpu_count() or 1)
            # CPU per event of each process, against the ceiling's per call: what the gap is made of
            unique.details["cpu_us_per_event"] = _per_unit_us(u)
            unique.details["ceiling_cpu_us_per_call"] = _per_unit_us(ceiling)
            unique.details["service_metrics"] = _fast_path_metrics(svc)
            if u.errors or u.unexpected:
                unique.note = f"{sum(u.errors.values())} errors, {u.unexpected} unexpected: {u.first_error}"
        else:
            unique.status = dup.status = "not implemented"
            unique.note = unimplemented
        if "dup" in table:
            _duplicates(dup_memory, table["dup"], ceiling, rounds_at, _fast_path_metrics(svc), "memory")
        rss.record("ingest", svc, "after the single-event sweep (unique + duplicate ingest)")

        # the Redis fast path itself: a second process on the same store and Redis keys, its memory
        # off, so every duplicate is a Redis hit; its own ceiling, in interleaved rounds
        if dup_ids is not None:
            rsvc = await procs.spawn(
                "ingest", procs.service_env(dsn, stores.redis_url, stores.redis_prefix, dedupe_memory_keys=0)
            )
            services.append(rsvc)
            rgot: dict[str, list[LoadResult]] = {"health": [], "dup": []}
            for _ in range(cfg.table_rounds):
                rgot["health"].append(await _load(HealthCheck, {"address": rsvc.address}, cfg, tc, rsvc))
                rbase = {"address": rsvc.address, "metadata": [list(m) for m in md], "ids": dup_ids}
                rgot["dup"].append(await _load(DuplicateIngest, rbase, cfg, tc, rsvc))
            rrounds = {k: [round(x.units_per_s, 1) for x in v] for k, v in rgot.items()}
            _duplicates(dup, _median(rgot["dup"]), _median(rgot["health"]), rrounds, _fast_path_metrics(rsvc), "redis")
            dup.details["redis_keys_under_prefix"] = await _redis_keys(stores)
            rsvc.stop()
        rss.record("ingest", svc, "after the single-event sweep (unique + duplicate ingest)")

        # batch ingest on a fresh database, and the raw statement on another fresh one
        try:
            bdsn = await stores.create_database("ingest_batch")
            bsvc = await procs.spawn("ingest", procs.service_env(bdsn, stores.redis_url, stores.redis_prefix + "b:"))
            services.append(bsvc)
            bmd = await env.bench_key(bdsn, PROJECT, ("ingest",))
            b = await _load(
                BatchIngest,
                {"address": bsvc.address, "metadata": [list(m) for m in bmd], "label": label, "batch": cfg.batch_size},
                cfg,
                cfg.batch_concurrency,
                bsvc,
                cfg.batch_duration,
            )
            rss.record("ingest", bsvc, f"after batch ingest ({cfg.batch_size} per call)")
            try:
                sdsn = await stores.create_database("ingest_sql")
                sql_params = {"dsn": sdsn, "label": label, "batch": cfg.batch_size}
                s = await _load(SqlBatch, sql_params, cfg, cfg.batch_concurrency, None, cfg.batch_duration)
                batch.measured(b.units_per_s, s.units_per_s, run=b.as_dict(), raw_sql=s.as_dict())
                batch.details["bound"] = cpu.bound(b.cpu, os.cpu_count() or 1)
            except ImportError as exc:
                batch.measured(b.units_per_s, None, run=b.as_dict())
                batch.note = f"raw-SQL baseline unavailable: {exc}"
        except NotImplementedError as exc:
            batch.status, batch.note = "not implemented", str(exc)
        await _api_batch(stores, cfg, api_batch)
    finally:
        for s in services:
            s.stop()
    return figures
