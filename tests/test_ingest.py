"""Event ingest (seed ADR-114 D1) against real Postgres, real Redis and real gRPC servers:
exactly one run per (project, channel, provider event id), duplicates answered with the
existing run, the Redis fast path and its failure modes, input limits, roles, retention."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import redis.asyncio as aioredis
from google.protobuf import struct_pb2

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from services.common import embedded, errors
from services.common.runs import RUN_READY_CHANNEL
from services.ingest import dedupe_cache, metrics, retention, store
from services.ingest.parsing import NewEvent
from tests.harness.helpers import eventually, expect_error

MEMORY_TG = metrics.DEDUPE_ANSWERS["telegram", "memory", True]

# --- helpers shared by the tests of this module ---------------------------------------------

PROJECT = "proj"
DUP = "E-IDEMPOTENT-001"
CH = common_pb2


def struct(data: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data)
    return s


def tg(update_id: int, project: str = PROJECT, **extra: Any) -> ingest_pb2.IngestEventRequest:
    return ingest_pb2.IngestEventRequest(
        project_id=project,
        channel_type=CH.CHANNEL_TYPE_TELEGRAM,
        payload=struct({"update_id": update_id, "message": {"text": f"hello {update_id}"}}),
        **extra,
    )


def delivery(channel: str, n: int = 1) -> ingest_pb2.IngestEventRequest:
    """One provider delivery per channel, identified the provider's way (nothing given explicitly)."""
    if channel == "telegram":
        return tg(n)
    if channel == "alertmanager":
        payload = {"groupKey": '{}:{alertname="Disk"}', "status": "firing", "alerts": [{"fingerprint": f"fp{n}"}]}
        return ingest_pb2.IngestEventRequest(
            project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_ALERTMANAGER, payload=struct(payload)
        )
    if channel == "gitea":
        return ingest_pb2.IngestEventRequest(
            project_id=PROJECT,
            channel_type=CH.CHANNEL_TYPE_GITEA,
            payload=struct({"ref": "refs/heads/main"}),
            headers={"x-gitea-delivery": f"delivery-{n}", "X-Gitea-Event": "push"},
        )
    if channel == "line":
        events = [{"type": "message", "webhookEventId": f"line-{n}-{i}"} for i in range(2)]
        return ingest_pb2.IngestEventRequest(
            project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_LINE, payload=struct({"events": events})
        )
    assert channel == "api"
    return ingest_pb2.IngestEventRequest(
        project_id=PROJECT,
        channel_type=CH.CHANNEL_TYPE_API,
        payload=struct({"ask": n}),
        headers={"Idempotency-Key": f"api-{n}"},
    )


async def serve(start_services, channels, make_key, roles=None, **overrides: Any):  # type: ignore[no-untyped-def]
    """(runtime, stub, metadata) for a fresh ingest server and a caller with the ingest role."""
    rt = await start_services("ingest", **overrides)
    md = await make_key(f"alice-{uuid.uuid4().hex[:6]}", roles or {PROJECT: ["ingest"]})
    return rt, ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"])), md


async def count(db: asyncpg.Connection, table: str, project: str = PROJECT) -> int:
    return int(await db.fetchval(f"SELECT count(*) FROM {table} WHERE project_id = $1", project))


def violations(err: grpc.aio.AioRpcError) -> list[str]:
    br = errors.bad_request(err)
    return [v.field for v in br.field_violations] if br else []


def counter(c: Any) -> float:
    return float(c._value.get())


# --- first arrival and duplicates ------------------------------------------------------------


async def test_first_arrival_creates_a_pending_run_dedupe_row_audit_and_wakeup(
    start_services, channels, make_key, db
) -> None:
    _rt, stub, md = await serve(start_services, channels, make_key)
    woken: asyncio.Queue[str] = asyncio.Queue()
    await db.add_listener(RUN_READY_CHANNEL, lambda *args: woken.put_nowait(args[3]))

    r = await stub.IngestEvent(tg(1001, max_attempts=5), metadata=md)
    (o,) = r.outcomes
    assert not o.duplicate and o.code == "" and o.provider_event_id == "1001"
    run = await db.fetchrow("SELECT * FROM awooop_run_state WHERE run_id = $1", uuid.UUID(o.run_id))
    assert run["status"] == "PENDING" and run["channel_type"] == "telegram" and run["provider_event_id"] == "1001"
    assert json.loads(run["input"]) == {"update_id": 1001, "message": {"text": "hello 1001"}}
    assert run["max_attempts"] == 5 and run["project_id"] == PROJECT
    dedupe = await db.fetchrow("SELECT * FROM awooop_channel_event_dedupe WHERE provider_event_id = '1001'")
    assert dedupe["run_id"] == run["run_id"] and dedupe["channel_type"] == "telegram"
    audit = await db.fetch("SELECT * FROM awooop_audit_log WHERE run_id = $1", run["run_id"])
    assert [(a["action"], a["to_status"]) for a in audit] == [("RUN_CREATED", "PENDING")]
    assert audit[0]["actor"].startswith("user:alice-")
    # the scheduler's waiting claimers are told which project has work
    assert await asyncio.wait_for(woken.get(), 5) == PROJECT


async def test_repeated_telegram_update_id_never_creates_a_second_run(start_services, channels, make_key, db) -> None:
    rt, stub, md = await serve(start_services, channels, make_key)
    first = (await stub.IngestEvent(tg(7), metadata=md)).outcomes[0]
    for _ in range(3):
        again = (await stub.IngestEvent(tg(7), metadata=md)).outcomes[0]
        assert again.duplicate and again.code == DUP and again.run_id == first.run_id
    # the same update_id with a different body is still the same Telegram update
    changed = tg(7)
    changed.payload.update({"edited": True})
    assert (await stub.IngestEvent(changed, metadata=md)).outcomes[0].run_id == first.run_id
    # Redis forgotten: Postgres' unique constraint still answers
    await rt.ctx.cache.call("delete", dedupe_cache.key(rt.ctx.cache, PROJECT, "telegram", "7"))
    assert (await stub.IngestEvent(tg(7), metadata=md)).outcomes[0].duplicate
    assert await count(db, "awooop_run_state") == 1
    assert await count(db, "awooop_channel_event_dedupe") == 1
    assert await count(db, "awooop_audit_log") == 1
    # another project is another tenant: its update 7 is its own run
    md2 = await make_key("carol", {"other": ["ingest"]})
    other = (await stub.IngestEvent(tg(7, project="other"), metadata=md2)).outcomes[0]
    assert not other.duplicate and other.run_id != first.run_id


async def test_every_channel_50_parallel_duplicates_across_two_servers(start_services, channels, make_key, db) -> None:
    """Seed 000: for each channel type, 50 identical deliveries sent at once, split between two
    ingest servers on the same store, create one run (LINE: one per event) and 49 duplicates.
    Half the rounds run without Redis so every request races on Postgres' unique constraint."""
    md = await make_key("alice", {PROJECT: ["ingest"]})
    rts = [await start_services("ingest"), await start_services("ingest")]
    no_redis = [await start_services("ingest", redis_url=""), await start_services("ingest", redis_url="")]
    for round_no, servers in enumerate((rts, no_redis)):
        stubs = [ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"])) for rt in servers]
        chans = ("telegram", "alertmanager", "gitea", "line", "api")
        calls = [stubs[i % 2].IngestEvent(delivery(c, round_no), metadata=md) for c in chans for i in range(50)]
        results = await asyncio.gather(*calls)
        for k, channel in enumerate(chans):
            answers = results[k * 50 : (k + 1) * 50]
            per_event = list(zip(*(r.outcomes for r in answers), strict=True))  # LINE: 2 events
            assert len(per_event) == (2 if channel == "line" else 1)
            for outcomes in per_event:
                assert len({o.run_id for o in outcomes}) == 1, channel
                assert sum(not o.duplicate for o in outcomes) == 1, channel
                assert all(o.code == DUP for o in outcomes if o.duplicate)
    rows = await db.fetch(
        """SELECT channel_type, count(*) AS runs, count(DISTINCT provider_event_id) AS ids
             FROM awooop_run_state GROUP BY channel_type"""
    )
    # two rounds per channel; LINE deliveries carry two events each
    assert {r["channel_type"]: (r["runs"], r["ids"]) for r in rows} == {
        "telegram": (2, 2),
        "alertmanager": (2, 2),
        "gitea": (2, 2),
        "line": (4, 4),
        "api": (2, 2),
    }
    # API events are deduplicated by the idempotency key table (seed 003), the others by channel dedupe rows
    assert await count(db, "awooop_channel_event_dedupe") == 10
    assert await count(db, "awooop_idempotency_key") == 2
    orphans = await db.fetchval(
        """SELECT count(*) FROM awooop_channel_event_dedupe d
            FULL JOIN (SELECT * FROM awooop_run_state WHERE channel_type <> 'api') r USING (run_id)
            WHERE d.run_id IS NULL OR r.run_id IS NULL"""
    )
    assert orphans == 0  # no dedupe row without its run, no channel run without its dedupe row


async def test_api_channel_takes_the_idempotency_key_metadata(start_services, channels, make_key, db) -> None:
    _rt, stub, md = await serve(start_services, channels, make_key)
    req = ingest_pb2.IngestEventRequest(project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_API, payload=struct({"a": 1}))
    first = (await stub.IngestEvent(req, metadata=(*md, ("idempotency-key", "k-1")))).outcomes[0]
    assert first.provider_event_id == "k-1" and not first.duplicate
    again = (await stub.IngestEvent(req, metadata=(*md, ("idempotency-key", "k-1")))).outcomes[0]
    assert again.duplicate and again.run_id == first.run_id
    err = await expect_error(stub.IngestEvent(req, metadata=md), grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
    assert violations(err) == ["provider_event_id"]


# --- batches -------------------------------------------------------------------------------------


async def test_a_deliverys_events_become_runs_in_the_order_sent(start_services, channels, make_key, db) -> None:
    """One LINE delivery (one statement) creates its runs with created_at in event order, the
    order the claim hands them out (oldest first): equal timestamps would leave it to chance."""
    _rt, stub, md = await serve(start_services, channels, make_key)
    ids = [f"evt-{c}" for c in "qwertyuiop"]  # not sorted: the order sent is what must survive
    events = [{"type": "message", "webhookEventId": i} for i in ids]
    req = ingest_pb2.IngestEventRequest(
        project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_LINE, payload=struct({"events": events})
    )
    out = (await stub.IngestEvent(req, metadata=md)).outcomes
    assert [o.provider_event_id for o in out] == ids and not any(o.duplicate for o in out)
    rows = await db.fetch(
        "SELECT provider_event_id, created_at, updated_at FROM awooop_run_state WHERE project_id = $1 "
        "ORDER BY created_at, run_id",
        PROJECT,
    )
    assert [r["provider_event_id"] for r in rows] == ids
    assert len({r["created_at"] for r in rows}) == len(ids)  # strictly ordered, no ties
    assert all(r["created_at"] == r["updated_at"] for r in rows)


async def test_batch_answers_per_event_in_order(start_services, channels, make_key, db) -> None:
    _rt, stub, md = await serve(start_services, channels, make_key)
    seen = (await stub.IngestEvent(tg(1), metadata=md)).outcomes[0]
    line = delivery("line", 9)
    batch = [tg(1), tg(2), line, tg(2), tg(3, input=struct({"only": "this"}))]
    r = await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=batch), metadata=md)
    assert [len(x.outcomes) for x in r.results] == [1, 1, 2, 1, 1]
    o = [x.outcomes for x in r.results]
    assert o[0][0].duplicate and o[0][0].run_id == seen.run_id and o[0][0].code == DUP
    assert not o[1][0].duplicate and o[1][0].provider_event_id == "2"
    assert [e.provider_event_id for e in o[2]] == ["line-9-0", "line-9-1"] and not any(e.duplicate for e in o[2])
    assert o[3][0].duplicate and o[3][0].run_id == o[1][0].run_id  # a repeat inside the batch
    assert not o[4][0].duplicate
    stored = await db.fetchval("SELECT input FROM awooop_run_state WHERE run_id = $1", uuid.UUID(o[4][0].run_id))
    assert json.loads(stored) == {"only": "this"}
    line_input = await db.fetchval("SELECT input FROM awooop_run_state WHERE run_id = $1", uuid.UUID(o[2][1].run_id))
    assert json.loads(line_input) == {"type": "message", "webhookEventId": "line-9-1"}
    assert await count(db, "awooop_run_state") == 5  # 1, 2, two LINE events, 3
    verify = ingest_pb2.IngestEventRequest(
        project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_LINE, payload=struct({"destination": "U1", "events": []})
    )
    assert list((await stub.IngestEvent(verify, metadata=md)).outcomes) == []  # LINE's URL check: no run
    again = await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=batch), metadata=md)
    assert all(e.duplicate for x in again.results for e in x.outcomes)
    assert [e.run_id for x in again.results for e in x.outcomes] == [e.run_id for x in r.results for e in x.outcomes]


async def test_a_batch_is_one_statement_on_postgres(db_dsn, db) -> None:
    """store.ingest sends one query for a whole batch of new and already-seen events."""
    conn = await asyncpg.connect(db_dsn)
    try:
        queries: list[str] = []
        conn.add_query_logger(lambda q: queries.append(q.query))

        def ev(i: int) -> NewEvent:
            return NewEvent(PROJECT, "telegram", str(i), json.dumps({"update_id": i}), 3)

        # the first use of a statement on a connection also introspects its array types, once
        await store.ingest(conn, [ev(-1)], principal_id="p", actor="user:p", retention=60)
        queries.clear()
        first = await store.ingest(conn, [ev(i) for i in range(200)], principal_id="p", actor="user:p", retention=60)
        assert len(queries) == 1 and all(s.created for s in first)
        mixed = await store.ingest(
            conn, [ev(i) for i in range(100, 300)], principal_id="p", actor="user:p", retention=60
        )
        assert len(queries) == 2
        assert [s.created for s in mixed] == [False] * 100 + [True] * 100
        assert [s.run_id for s in mixed[:100]] == [s.run_id for s in first[100:]]
    finally:
        await conn.close()
    assert await count(db, "awooop_run_state") == 301


class _Explaining:
    """A connection for store.ingest that first runs each statement under EXPLAIN ANALYZE in a
    transaction it rolls back (keeping the plan), then runs it for real."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.plans: list[dict[str, Any]] = []

    async def fetch(self, sql: str, *args: Any, timeout: float | None = None) -> list[asyncpg.Record]:
        tr = self.conn.transaction()
        await tr.start()
        try:
            raw = await self.conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args, timeout=timeout)
        finally:
            await tr.rollback()
        self.plans.append(json.loads(raw)[0]["Plan"])
        return await self.conn.fetch(sql, *args, timeout=timeout)


async def test_only_an_event_seen_before_reads_its_dedupe_row(db: asyncpg.Connection) -> None:
    """StoreEvents answers a new event from its own insert: the probe of the dedupe key runs
    for the events whose insert met an existing row, never for the others (it ran for all)."""

    def probes(plan: dict[str, Any]) -> list[int]:
        index = "awooop_channel_event_dedupe_pkey"
        found = [plan.get("Actual Loops", 0)] if plan.get("Index Name") == index else []
        return found + [n for child in plan.get("Plans", []) for n in probes(child)]

    def ev(name: str) -> NewEvent:
        return NewEvent(PROJECT, "telegram", name, "{}", 3)

    await store.ingest(db, [ev(f"seen-{i}") for i in range(5)], principal_id="p", actor="user:p", retention=60)
    explaining = _Explaining(db)
    events = [ev(f"seen-{i}") for i in range(5)] + [ev(f"new-{i}") for i in range(15)]
    stored = await store.ingest(explaining, events, principal_id="p", actor="user:p", retention=60)  # type: ignore[arg-type]
    assert [s.created for s in stored] == [False] * 5 + [True] * 15
    assert all(s.ttl_left is not None and 0 < s.ttl_left <= 60 for s in stored[:5])
    assert probes(explaining.plans[0]) == [5], explaining.plans[0]
    assert await count(db, "awooop_run_state") == 20


# --- the Redis fast path ----------------------------------------------------------------------


async def test_redis_answers_duplicates_without_postgres(start_services, channels, make_key) -> None:
    rt, stub, md = await serve(start_services, channels, make_key, auth_cache_seconds=60)
    first = (await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=[tg(1), tg(2)]), metadata=md)).results
    await rt.ctx.pool.close()  # Postgres is now out of reach for this server
    dup = await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=[tg(2), tg(1)]), metadata=md)
    assert [x.outcomes[0].run_id for x in dup.results] == [first[1].outcomes[0].run_id, first[0].outcomes[0].run_id]
    assert all(x.outcomes[0].duplicate for x in dup.results)
    # a new event needs Postgres: the documented retryable answer, not INTERNAL
    await expect_error(stub.IngestEvent(tg(3), metadata=md), grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")


async def test_redis_stopped_mid_test_no_duplicates_and_automatic_recovery(
    start_services, channels, make_key, db, tmp_path: Path
) -> None:
    rd = embedded.start_redis(tmp_path / "r1")
    try:
        # the process's own memory of recent ids is off: this is about Redis and Postgres
        rt, stub, md = await serve(start_services, channels, make_key, redis_url=rd.url, dedupe_memory_keys=0)
        client = aioredis.from_url(rd.url)
        first = await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=[tg(i) for i in range(20)]), metadata=md)
        run_of = {i: first.results[i].outcomes[0].run_id for i in range(20)}
        assert await client.get(dedupe_cache.key(rt.ctx.cache, PROJECT, "telegram", "3")) == run_of[3].encode()
        await client.aclose()

        rd.stop()  # Redis goes away while traffic continues
        calls = [stub.IngestEvent(tg(i), metadata=md) for i in range(40) for _ in range(2)]
        answers = [r.outcomes[0] for r in await asyncio.gather(*calls)]
        for i in range(20):  # old events: duplicates of their original runs, never new runs
            assert all(a.duplicate and a.run_id == run_of[i] for a in answers[2 * i : 2 * i + 2])
        for i in range(20, 40):  # new events: exactly one of the two parallel copies created it
            pair = answers[2 * i : 2 * i + 2]
            assert sorted(a.duplicate for a in pair) == [False, True] and pair[0].run_id == pair[1].run_id
        assert await count(db, "awooop_run_state") == 40

        rd = embedded.start_redis(tmp_path / "r2", port=rd.port)  # back, and empty
        client = aioredis.from_url(rd.url)
        key = dedupe_cache.key(rt.ctx.cache, PROJECT, "telegram", "25")

        async def refilled() -> bool:
            # each duplicate answered by Postgres writes its key back once Redis answers again
            assert (await stub.IngestEvent(tg(25), metadata=md)).outcomes[0].duplicate
            return bool(await client.exists(key))

        await eventually(refilled, what="redis refilled after restart")
        hits = counter(metrics.REDIS_HITS)
        assert (await stub.IngestEvent(tg(25), metadata=md)).outcomes[0].duplicate
        assert counter(metrics.REDIS_HITS) == hits + 1  # answered from Redis again

        await client.flushall()  # flushed: Postgres still knows every event
        again = await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=[tg(i) for i in range(40)]), metadata=md)
        assert all(x.outcomes[0].duplicate for x in again.results)
        assert await client.exists(key)
        await client.aclose()
        assert await count(db, "awooop_run_state") == 40
    finally:
        rd.stop()


async def test_redis_keys_expire_no_later_than_retention(start_services, channels, make_key) -> None:
    rt, stub, md = await serve(start_services, channels, make_key, dedupe_retention=120.0, redis_dedupe_ttl=3600.0)
    await stub.IngestEvent(tg(1), metadata=md)
    ttl = await rt.ctx.cache.call("ttl", dedupe_cache.key(rt.ctx.cache, PROJECT, "telegram", "1"))
    assert 0 < ttl <= 120


async def test_the_process_memory_answers_duplicates_without_redis_or_postgres(
    start_services, channels, make_key
) -> None:
    rt, stub, md = await serve(start_services, channels, make_key, redis_url="", auth_cache_seconds=60)
    first = (await stub.IngestEvent(tg(1), metadata=md)).outcomes[0]
    await rt.ctx.pool.close()  # no Redis configured, and now no Postgres either
    hits = counter(MEMORY_TG)
    again = await asyncio.gather(*(stub.IngestEvent(tg(1), metadata=md) for _ in range(10)))
    assert {(a.outcomes[0].run_id, a.outcomes[0].duplicate) for a in again} == {(first.run_id, True)}
    assert counter(MEMORY_TG) == hits + 10
    await expect_error(stub.IngestEvent(tg(2), metadata=md), grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")

    # off: the same duplicate needs the store
    _rt2, off, md2 = await serve(start_services, channels, make_key, redis_url="", dedupe_memory_keys=0)
    await off.IngestEvent(tg(3), metadata=md2)
    await _rt2.ctx.pool.close()
    await expect_error(off.IngestEvent(tg(3), metadata=md2), grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")


async def test_what_redis_and_postgres_answer_is_remembered_no_longer_than_their_keys_live(
    start_services, channels, make_key, db
) -> None:
    """Replica A creates the runs; replica B learns them from Redis (with the key's time to live) or
    from Postgres (with the dedupe row's time left), never for longer than retention."""
    from services.common.cache import Cache
    from services.ingest.events import EventIngestor
    from services.ingest.wakeup import Notifier

    rt, stub, md = await serve(start_services, channels, make_key, dedupe_retention=120.0, redis_dedupe_ttl=3600.0)
    created = await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=[tg(1), tg(2)]), metadata=md)
    # B: a second ingestor on the same stores, its memory empty
    s = rt.ctx.settings
    b = EventIngestor(rt.ctx.pool, Cache(s), s, Notifier(rt.ctx.pool))
    key2 = dedupe_cache.key(b.cache, PROJECT, "telegram", "2")

    async def written() -> bool:  # A writes its keys after answering
        return bool(await b.cache.call("exists", key2))

    await eventually(written, what="A's Redis keys")
    await b.cache.call("delete", key2)  # only Postgres knows 2 now
    ev = [NewEvent(PROJECT, "telegram", pid, "{}", 3) for pid in ("1", "2")]
    hits, misses = counter(metrics.REDIS_HITS), counter(metrics.REDIS_MISSES)
    by_path = [counter(metrics.DEDUPE_ANSWERS["telegram", p, True]) for p in ("redis", "postgres")]
    out = await b.ingest(ev, principal_id="p", actor="t")
    assert [(o.run_id, o.duplicate) for o in out] == [(r.outcomes[0].run_id, True) for r in created.results]
    assert (counter(metrics.REDIS_HITS), counter(metrics.REDIS_MISSES)) == (hits + 1, misses + 1)
    # 1 answered by Redis, 2 by Postgres, each counted by its path
    assert [counter(metrics.DEDUPE_ANSWERS["telegram", p, True]) for p in ("redis", "postgres")] == [
        by_path[0] + 1,
        by_path[1] + 1,
    ]
    for pid in ("1", "2"):
        entry = b.recent._entries[dedupe_cache.key(b.cache, PROJECT, "telegram", pid)]
        left = entry[1] - time.monotonic()
        assert 100 < left <= 120  # retention, not the 3600 s Redis TTL setting
    # the second time neither store is asked
    memory = counter(MEMORY_TG)
    assert all(o.duplicate for o in await b.ingest(ev, principal_id="p", actor="t"))
    assert counter(MEMORY_TG) == memory + 2
    assert (counter(metrics.REDIS_HITS), counter(metrics.REDIS_MISSES)) == (hits + 1, misses + 1)
    await b.drain()
    await b.cache.close()


async def test_unique_traffic_skips_the_redis_lookup_and_redeliveries_bring_it_back(
    start_services, channels, make_key, db
) -> None:
    """Fresh events teach the process that asking Redis first does not pay: their keys go straight
    to Postgres. Exactly-once does not depend on it (Postgres decides, parallel copies of a new
    event make one run), and a burst of redeliveries, answered by Postgres, opens the gate again."""
    # the process's own memory off: every duplicate here reaches Redis or Postgres
    _rt, stub, md = await serve(start_services, channels, make_key, dedupe_memory_keys=0)
    lookups = [counter(metrics.REDIS_LOOKUPS.labels(r)) for r in ("hit", "miss", "skipped")]
    for i in range(0, 200, 20):  # 200 fresh events, 20 a call
        await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=[tg(i + j) for j in range(20)]), metadata=md)
    hit, miss, skipped = (
        counter(metrics.REDIS_LOOKUPS.labels(r)) - n for r, n in zip(("hit", "miss", "skipped"), lookups, strict=True)
    )
    # Redis was asked until about 90 fresh events had missed, then no more
    assert hit == 0 and miss + skipped == 200 and skipped >= 100

    # the gate closed: parallel copies of new events still make one run each, and old events
    # sent again are duplicates of their runs, answered by Postgres
    calls = [stub.IngestEvent(tg(i), metadata=md) for i in range(190, 230) for _ in range(2)]
    answers = [r.outcomes[0] for r in await asyncio.gather(*calls)]
    for k in range(40):
        pair = answers[2 * k : 2 * k + 2]
        assert pair[0].run_id == pair[1].run_id
        if 190 + k < 200:
            assert all(a.duplicate for a in pair)
        else:
            assert sorted(a.duplicate for a in pair) == [False, True]
    assert await count(db, "awooop_run_state") == 230

    # redeliveries of old events: answered by Postgres at first, then Redis is asked again
    hits = counter(metrics.REDIS_HITS)
    for i in range(0, 120, 20):
        again = await stub.IngestEvents(
            ingest_pb2.IngestEventsRequest(events=[tg(i + j) for j in range(20)]), metadata=md
        )
        assert all(x.outcomes[0].duplicate for x in again.results)
    assert counter(metrics.REDIS_HITS) > hits  # the gate opened: Redis answers duplicates again
    assert await count(db, "awooop_run_state") == 230


def test_the_lookup_gate_follows_the_share_of_duplicates() -> None:
    from services.ingest.lookup_gate import LookupGate

    g = LookupGate(min_share=0.25, window=64)
    assert g.open  # a new process asks Redis
    g.observe(200, 0)
    assert not g.open and g.share < 0.25
    g.observe(10, 10)  # a few redeliveries do not open it at once ...
    assert not g.open
    g.observe(30, 30)  # ... a burst does
    assert g.open
    g.observe(0, 0)  # nothing answered: nothing learnt
    assert g.open


def test_recent_keys_forget_the_least_recently_used_and_the_expired() -> None:
    from services.ingest.recent import RecentKeys

    m = RecentKeys(capacity=3)
    for i in range(3):
        m.put(f"k{i}", f"r{i}", ttl=10, now=100.0)
    assert m.get("k0", now=101.0) == "r0"  # k0 is now the most recently used
    m.put("k3", "r3", ttl=10, now=101.0)  # evicts k1
    assert [m.get(k, now=102.0) for k in ("k0", "k1", "k2", "k3")] == ["r0", None, "r2", "r3"]
    assert m.get("k2", now=110.0) is None and len(m) == 2  # expired: gone
    m.put("short", "r", ttl=0.5, now=100.0)  # under a second left: not worth remembering
    assert m.get("short", now=100.0) is None
    off = RecentKeys(capacity=0)
    off.put("k", "r", ttl=10)
    assert off.get("k") is None and len(off) == 0


# --- input limits and roles --------------------------------------------------------------------


async def test_bad_input_is_invalid_argument_with_field_paths(start_services, channels, make_key, db) -> None:
    _rt, stub, md = await serve(start_services, channels, make_key, max_payload_bytes=1024, max_batch=3)
    cases: list[tuple[Any, list[str]]] = [
        (ingest_pb2.IngestEventRequest(project_id=PROJECT, channel_type=99, provider_event_id="x"), ["channel_type"]),
        (ingest_pb2.IngestEventRequest(project_id=PROJECT, provider_event_id="x"), ["channel_type"]),
        (tg(1, project="no spaces allowed"), ["project_id"]),
        (tg(1, project="p" * 65), ["project_id"]),
        (tg(1, provider_event_id="x" * 257), ["provider_event_id"]),
        (tg(1, max_attempts=101), ["max_attempts"]),
        (tg(1, max_attempts=-1), ["max_attempts"]),
        (tg(1, input=struct({"blob": "z" * 2000})), ["input"]),
        (tg(1, headers={"X-Big": "v" * 9000}), ["headers.X-Big"]),
        (
            ingest_pb2.IngestEventRequest(project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_TELEGRAM),
            ["payload.update_id"],
        ),
        (
            ingest_pb2.IngestEventRequest(project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_GITEA),
            ["headers.X-Gitea-Delivery"],
        ),
    ]
    for req, fields in cases:
        err = await expect_error(stub.IngestEvent(req, metadata=md), grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
        assert violations(err) == fields, (req, err.details())
    batch = ingest_pb2.IngestEventsRequest(
        events=[tg(1), ingest_pb2.IngestEventRequest(project_id=PROJECT, channel_type=1)]
    )
    err = await expect_error(stub.IngestEvents(batch, metadata=md), grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
    assert violations(err) == ["events[1].payload.update_id"]
    too_many = ingest_pb2.IngestEventsRequest(events=[tg(i) for i in range(4)])
    err = await expect_error(stub.IngestEvents(too_many, metadata=md), grpc.StatusCode.INVALID_ARGUMENT)
    assert violations(err) == ["events"]
    line = ingest_pb2.IngestEventRequest(
        project_id=PROJECT,
        channel_type=CH.CHANNEL_TYPE_LINE,
        payload=struct({"events": [{"webhookEventId": f"w{i}"} for i in range(4)]}),
    )
    err = await expect_error(stub.IngestEvent(line, metadata=md), grpc.StatusCode.INVALID_ARGUMENT)
    assert violations(err) == ["payload.events"]  # a LINE delivery counts its events against max_batch
    await expect_error(
        stub.IngestEvents(ingest_pb2.IngestEventsRequest(), metadata=md), grpc.StatusCode.INVALID_ARGUMENT
    )
    # many bad events: the answer lists a bounded number of them
    bad = ingest_pb2.IngestEventRequest(provider_event_id="x" * 257, max_attempts=101)  # 4 bad fields
    err = await expect_error(
        stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=[bad] * 3), metadata=md),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert len(violations(err)) == 11  # 10 of the 12 listed, plus a note saying 2 more
    assert await count(db, "awooop_run_state") == 0  # a refused call changes nothing


async def test_ingest_role_is_required_in_every_events_project(start_services, channels, make_key, db) -> None:
    _rt, stub, md = await serve(start_services, channels, make_key, roles={"other": ["ingest"], PROJECT: ["worker"]})
    err = await expect_error(stub.IngestEvent(tg(1), metadata=md), grpc.StatusCode.PERMISSION_DENIED, "FORBIDDEN")
    assert errors.error_info(err).metadata["project_id"] == PROJECT  # type: ignore[union-attr]
    batch = ingest_pb2.IngestEventsRequest(events=[tg(1, project="other"), tg(2)])
    err = await expect_error(stub.IngestEvents(batch, metadata=md), grpc.StatusCode.PERMISSION_DENIED, "FORBIDDEN")
    info = errors.error_info(err)
    assert info is not None and info.metadata["project_id"] == PROJECT and info.metadata["event_index"] == "1"
    assert await count(db, "awooop_run_state", "other") == 0  # all or nothing
    admin = await make_key("root", {"*": ["admin"]})
    assert not (await stub.IngestEvents(batch, metadata=admin)).results[1].outcomes[0].duplicate


# --- retention ---------------------------------------------------------------------------------


async def test_pruning_removes_only_expired_rows_and_a_reused_id_makes_a_new_run(
    start_services, channels, make_key, db
) -> None:
    # The rows are aged in the database behind the process's back; its memory of recent ids would
    # still hold them (in real time it forgets them before retention ends), so it is off here.
    rt, stub, md = await serve(start_services, channels, make_key, dedupe_memory_keys=0)
    first = await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=[tg(1), tg(2), tg(3)]), metadata=md)
    run1 = first.results[0].outcomes[0].run_id
    # the database clock is the truth: age two rows past the 7-day retention, one just inside it
    await db.execute(
        """UPDATE awooop_channel_event_dedupe SET created_at = now() - interval '8 days'
            WHERE provider_event_id IN ('1', '2')"""
    )
    await db.execute(
        """UPDATE awooop_channel_event_dedupe SET created_at = now() - interval '6 days 23 hours'
            WHERE provider_event_id = '3'"""
    )
    before = counter(metrics.PRUNED.labels("awooop_channel_event_dedupe"))
    s = rt.ctx.settings
    pruned = await retention.prune_dedupe(rt.ctx.pool, rt.ctx.cache, retention=s.dedupe_retention, batch=1)
    assert pruned == 2
    assert counter(metrics.PRUNED.labels("awooop_channel_event_dedupe")) == before + 2
    left = await db.fetch("SELECT provider_event_id FROM awooop_channel_event_dedupe")
    assert [r["provider_event_id"] for r in left] == ["3"]
    assert await count(db, "awooop_run_state") == 3  # runs are never pruned
    assert await rt.ctx.cache.call("exists", dedupe_cache.key(rt.ctx.cache, PROJECT, "telegram", "1")) == 0
    # after retention a re-sent update is a new event; inside it, still a duplicate
    again = await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=[tg(1), tg(3)]), metadata=md)
    assert not again.results[0].outcomes[0].duplicate and again.results[0].outcomes[0].run_id != run1
    assert again.results[1].outcomes[0].duplicate
    assert await retention.prune_dedupe(rt.ctx.pool, rt.ctx.cache, retention=s.dedupe_retention, batch=10) == 0


async def test_concurrent_pruners_share_the_work(start_services, channels, make_key, db) -> None:
    """Two replicas pruning at once: every expired row deleted exactly once, no waits or errors."""
    rt, stub, md = await serve(start_services, channels, make_key)
    rt2 = await start_services("ingest")
    await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=[tg(i) for i in range(60)]), metadata=md)
    await db.execute(
        """UPDATE awooop_channel_event_dedupe SET created_at = now() - interval '8 days'
            WHERE provider_event_id::int < 50"""
    )
    ret = rt.ctx.settings.dedupe_retention
    counts = await asyncio.gather(
        *(retention.prune_dedupe(r.ctx.pool, r.ctx.cache, retention=ret, batch=5) for r in (rt, rt2, rt, rt2))
    )
    assert sum(counts) == 50
    assert await count(db, "awooop_channel_event_dedupe") == 10


async def test_retention_loop_prunes_in_the_background(start_services, channels, make_key, db) -> None:
    _rt, stub, md = await serve(start_services, channels, make_key, prune_interval=0.2, dedupe_retention=3600.0)
    await stub.IngestEvents(ingest_pb2.IngestEventsRequest(events=[tg(1), tg(2)]), metadata=md)
    await db.execute(
        "UPDATE awooop_channel_event_dedupe SET created_at = now() - interval '2 hours' WHERE provider_event_id = '1'"
    )

    async def pruned() -> bool:
        return await count(db, "awooop_channel_event_dedupe") == 1

    await eventually(pruned, what="the retention loop to prune the expired row")
    assert await db.fetchval("SELECT provider_event_id FROM awooop_channel_event_dedupe") == "2"
