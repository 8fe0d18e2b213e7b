"""Debounce and batch at ingest (issue 46) against the real services and store: a burst of one
key's events is one run carrying them (mode all, mode last), started once the key was quiet for the
window and no later than the max wait; a provider retry of an event in a batch is a duplicate
answered with the batch's run; a batch of mixed keys and projects beside a paused project and a
concurrency key; concurrent events of one key through two ingest processes; the crash points of an
ingest call (before the store, after its commit but before the answer, after the answer) and a
SIGKILL of ingest inside a window; a Postgres restart inside a window; bad rules refused with
details."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import hmac
import json
import os
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import grpc
from google.protobuf import struct_pb2
from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToDict

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common import errors
from services.common.settings import Settings
from services.ingest import debounce, retention
from services.ingest.debounce import batch_input
from services.scheduler import metrics as scheduler_metrics
from services.scheduler.queue import QueueSampler
from tests.harness import rpc_proxy
from tests.harness.flow import Flow, serve
from tests.harness.helpers import eventually, expect_error, settings_env, spawn_services
from tests.harness.infra import key_on
from tests.harness.pgcluster import PgCluster, create_migrated_db
from tests.harness.scheduler import run_row

TELEGRAM = common_pb2.CHANNEL_TYPE_TELEGRAM


def tg(project: str, update_id: int, chat: int | None, **kw: Any) -> ingest_pb2.IngestEventRequest:
    """A Telegram update of chat (None: one without a chat, which no rule can key)."""
    payload = struct_pb2.Struct()
    message: dict[str, Any] = {"text": f"m{update_id}"}
    if chat is not None:
        message["chat"] = {"id": chat}
    payload.update({"update_id": update_id, "message": message})
    return ingest_pb2.IngestEventRequest(project_id=project, channel_type=TELEGRAM, payload=payload, **kw)


def secs(value: float) -> Duration:
    return Duration(seconds=int(value), nanos=round((value - int(value)) * 1e9))


async def set_rule(
    sched: Any, md: Any, project: str, window: float, max_wait: float, mode: int = pb.DEBOUNCE_MODE_ALL
) -> pb.DebounceRule:
    rule = pb.DebounceRule(
        project_id=project,
        channel_type=TELEGRAM,
        key_expression="message.chat.id",
        window=secs(window),
        max_wait=secs(max_wait),
        mode=mode,
    )
    return (await sched.SetDebounceRule(pb.SetDebounceRuleRequest(rule=rule), metadata=md)).rule


async def send(f: Flow, req: ingest_pb2.IngestEventRequest) -> ingest_pb2.EventOutcome:
    (outcome,) = (await f.ingest.IngestEvent(req, metadata=f.creator)).outcomes
    return outcome


async def batch_of(db: asyncpg.Connection, run_id: str) -> tuple[list[int], dict[str, Any]]:
    """The update ids a batch run's input carries, in order, and its `debounce` part."""
    data = json.loads((await run_row(db, run_id))["input"])
    return [e["update_id"] for e in data["events"]], data["debounce"]


async def claimed_once(db: asyncpg.Connection, run_id: str) -> bool:
    n = await db.fetchval(
        "SELECT count(*) FROM awooop_audit_log WHERE run_id = $1 AND action = 'CLAIMED'", uuid.UUID(run_id)
    )
    return bool(n == 1)


def test_the_input_shape_is_defined_once() -> None:
    first = batch_input("7", "all", None, [{"a": 1}, {"a": 2}])
    assert first == {"events": [{"a": 1}, {"a": 2}], "debounce": {"key": "7", "mode": "all", "count": 2}}
    assert batch_input("7", "all", first, [{"a": 3}])["events"] == [{"a": 1}, {"a": 2}, {"a": 3}]
    last = batch_input("7", "last", first, [{"a": 3}, {"a": 4}])
    assert last == {"events": [{"a": 4}], "debounce": {"key": "7", "mode": "last", "count": 4}}


async def test_a_burst_is_one_run_per_key_beside_a_paused_project_and_a_concurrency_key(
    start_services, channels, db, make_key
) -> None:
    """One IngestEvents batch holding two chats of p, a repeated event, a paused project q's chat
    and an event without a chat; more events singly; retries. Each chat is one run with its events
    in order, started after the quiet window, once; the keyless event is a run of its own at once;
    q's batch waits for its resume; p's runs share a concurrency key of limit 1."""
    f = await serve(start_services, channels, db, make_key, debounce_rule_cache_seconds=0)
    q_admin = await make_key("q-root", {"q": ["admin"]})
    rule = await set_rule(f.sched, f.admin, "p", window=1.5, max_wait=60)
    assert rule.mode == pb.DEBOUNCE_MODE_ALL and rule.updated_by and rule.updated_at.seconds > 0
    await set_rule(f.sched, q_admin, "q", window=1.5, max_wait=60)
    await f.sched.PauseProject(pb.PauseProjectRequest(project_id="q", reason="maintenance"), metadata=q_admin)
    await f.sched.SetConcurrencyLimit(
        pb.SetConcurrencyLimitRequest(project_id="p", key="chat", max_running=1), metadata=f.admin
    )
    keyed = {"concurrency_keys": ["chat"]}
    deliveries = [
        tg("p", 1, 100, **keyed),
        tg("p", 2, 200, **keyed),
        tg("p", 3, 100, **keyed),
        tg("p", 1, 100, **keyed),  # the same update again, in the same batch
        tg("q", 1, 100),
        tg("p", 4, None, **keyed),  # no chat: not debounced
        tg("q", 2, 100),
        tg("p", 5, 200, **keyed),
    ]
    resp = await f.ingest.IngestEvents(ingest_pb2.IngestEventsRequest(events=deliveries), metadata=f.creator)
    o = [r.outcomes[0] for r in resp.results]
    chat_a, chat_b, q_run, plain = o[0].run_id, o[1].run_id, o[4].run_id, o[5].run_id
    assert len({chat_a, chat_b, q_run, plain}) == 4
    assert [x.run_id for x in o] == [chat_a, chat_b, chat_a, chat_a, q_run, plain, q_run, chat_b]
    assert [x.duplicate for x in o] == [False, False, False, True, False, False, False, False]
    # a single event joins its chat's open batch; a provider retry is the batch's duplicate
    assert (await send(f, tg("p", 6, 100, **keyed))).run_id == chat_a
    retry = await send(f, tg("p", 3, 100, **keyed))
    assert retry.duplicate and retry.run_id == chat_a and retry.code == "E-IDEMPOTENT-001"

    got = (await f.sched.GetRun(pb.GetRunRequest(run_id=chat_a), metadata=f.worker)).run
    assert got.status == common_pb2.RUN_STATUS_PENDING and got.wait_reason == "debounce" and got.not_before.seconds
    # only the keyless event's run is claimable during the window
    (first,) = await f.claim()
    assert first.run.run_id == plain

    # once the window is quiet the batches are due: key "chat" (limit 1) is held by the first run,
    # so a claim parks them; completing it lets them through one at a time
    async def parked() -> bool:
        await f.claim()
        n = await db.fetchval(
            "SELECT count(*) FROM awooop_run_state WHERE project_id = 'p' AND wait_reason = 'key_busy'"
        )
        return bool(n == 2)

    await eventually(parked, timeout=15, what="both chats' batches due and parked on the key")
    await f.sched.CompleteRun(pb.CompleteRunRequest(lease=first.lease), metadata=f.worker)
    started = []
    for _ in range(2):
        (c,) = await eventually(f.claim, timeout=10, what="a batch run claimed")
        started.append(c.run.run_id)
        await f.sched.CompleteRun(pb.CompleteRunRequest(lease=c.lease), metadata=f.worker)
    assert sorted(started) == sorted([chat_a, chat_b])
    assert await batch_of(db, chat_a) == ([1, 3, 6], {"key": "100", "mode": "all", "count": 3})
    assert await batch_of(db, chat_b) == ([2, 5], {"key": "200", "mode": "all", "count": 2})
    for run_id in (plain, chat_a, chat_b):
        assert await claimed_once(db, run_id)
    # a later event of chat 100 opens a new batch: the old one was claimed
    assert (await send(f, tg("p", 7, 100))).run_id not in (chat_a, chat_b)

    # the paused project's batch: due, but not claimed until the project resumes
    async def due(run_id: str) -> bool:
        return bool(
            await db.fetchval("SELECT not_before < now() FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id))
        )

    await eventually(lambda: due(q_run), timeout=10, what="q's batch due")
    assert await f.claim(["q"]) == []
    await f.sched.ResumeProject(pb.ResumeProjectRequest(project_id="q"), metadata=q_admin)
    (c,) = await f.claim(["q"])
    assert c.run.run_id == q_run and await batch_of(db, q_run) == ([1, 2], {"key": "100", "mode": "all", "count": 2})


async def test_mode_last_and_the_max_wait_bound_a_steady_stream(start_services, channels, db, make_key) -> None:
    """Events of one chat every 0.1 s for 3 s, window 1 s, max wait 1.5 s, mode last: the stream is
    cut into batches at most 1.5 s long; each run carries its latest event and the count, and the
    counts add up to every event; each batch is due at min(first + max wait, last + window)."""
    f = await serve(start_services, channels, db, make_key, debounce_rule_cache_seconds=0)
    await set_rule(f.sched, f.admin, "p", window=1.0, max_wait=1.5, mode=pb.DEBOUNCE_MODE_LAST)
    runs: dict[str, list[int]] = {}
    for update_id in range(1, 31):
        o = await send(f, tg("p", update_id, 7))
        assert not o.duplicate
        runs.setdefault(o.run_id, []).append(update_id)
        await asyncio.sleep(0.1)  # the stream's pace (not a wait for a condition)
    assert len(runs) >= 2, runs  # 3 s of events cannot fit one batch of at most 1.5 s
    for run_id, ids in runs.items():
        assert await batch_of(db, run_id) == ([ids[-1]], {"key": "7", "mode": "last", "count": len(ids)})
        row = await run_row(db, run_id)
        opened = await db.fetchval("SELECT created_at FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id))
        bound = await db.fetchval(
            "SELECT least($1::timestamptz + interval '1.5 s', updated_at + interval '1 s') FROM awooop_run_state"
            " WHERE run_id = $2",
            opened,
            uuid.UUID(run_id),
        )
        assert row["not_before"] == bound and row["not_before"] - opened <= dt.timedelta(seconds=1.5)
    first = await run_row(db, next(iter(runs)))
    # the first batch met its max wait: 1.5 s after its first event, not a second after its last
    assert first["not_before"] - first["created_at"] == dt.timedelta(seconds=1.5)
    # retention prunes a key's window row once its batch opened longer ago than the dedupe retention
    await db.execute("UPDATE awooop_debounce_window SET opened_at = now() - interval '8 days'")
    assert f.rt.ctx is not None
    await retention.prune(f.rt.ctx.pool, f.rt.ctx.cache, f.rt.ctx.settings)
    assert await db.fetchval("SELECT count(*) FROM awooop_debounce_window") == 0


async def test_concurrent_events_of_one_key_through_two_ingest_processes_are_one_run(
    start_services, channels, db, make_key
) -> None:
    """60 events of one chat sent at once, half through each of two ingest servers (and a retry of
    each): one run holds all 60, each once; every answer names it. Once claimed, the chat's next
    event opens a new batch."""
    f = await serve(start_services, channels, db, make_key, debounce_rule_cache_seconds=0)
    other = await start_services("ingest", debounce_rule_cache_seconds=0)
    stubs = [f.ingest, ingest_pb2_grpc.IngestServiceStub(channels(other.ports["ingest"]))]
    await set_rule(f.sched, f.admin, "p", window=2.0, max_wait=60)

    async def one(update_id: int) -> ingest_pb2.EventOutcome:
        stub = stubs[update_id % 2]
        (o,) = (await stub.IngestEvent(tg("p", update_id, 9), metadata=f.creator)).outcomes
        return o

    first = await asyncio.gather(*(one(i) for i in range(1, 61)))
    again = await asyncio.gather(*(one(i) for i in range(1, 61)))
    assert len({o.run_id for o in first + again}) == 1
    assert not any(o.duplicate for o in first) and all(o.duplicate for o in again)
    run_id = first[0].run_id
    ids, meta = await batch_of(db, run_id)
    assert sorted(ids) == list(range(1, 61)) and meta["count"] == 60
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE project_id = 'p'") == 1
    assert f.rt.ctx is not None
    await QueueSampler(f.rt.ctx.pool).sample()  # the open window, in the scheduler's gauge
    assert scheduler_metrics.DEBOUNCING.labels("p")._value.get() == 1
    (c,) = await eventually(f.claim, timeout=15, what="the batch claimed after its window")
    assert c.run.run_id == run_id and await claimed_once(db, run_id)
    assert (await one(61)).run_id != run_id


async def test_bad_rules_are_refused_with_details_and_changes_are_audited(
    start_services, channels, db, make_key
) -> None:
    f = await serve(start_services, channels, db, make_key)
    bad = pb.DebounceRule(
        project_id="p",
        channel_type=common_pb2.CHANNEL_TYPE_UNSPECIFIED,
        key_expression="message..chat",
        window=secs(0),
        max_wait=secs(90000),
        mode=7,  # type: ignore[arg-type]  # no such mode
    )
    err = await expect_error(
        f.sched.SetDebounceRule(pb.SetDebounceRuleRequest(rule=bad), metadata=f.admin),
        grpc.StatusCode.INVALID_ARGUMENT,
        "FIELD_INVALID",
    )
    fields = {v.field: v.description for v in errors.bad_request(err).field_violations}  # type: ignore[union-attr]
    assert set(fields) == {"rule.channel_type", "rule.key_expression", "rule.window", "rule.max_wait", "rule.mode"}
    assert "UNSPECIFIED" in fields["rule.channel_type"] and "dotted path" in fields["rule.key_expression"]
    short = pb.DebounceRule(project_id="p", channel_type=TELEGRAM, key_expression="a", window=secs(5), max_wait=secs(1))
    err = await expect_error(
        f.sched.SetDebounceRule(pb.SetDebounceRuleRequest(rule=short), metadata=f.admin),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert [v.field for v in errors.bad_request(err).field_violations] == ["rule.max_wait"]  # type: ignore[union-attr]
    # unset max wait: ten windows; a worker may read the rules, not set them
    rule = pb.DebounceRule(project_id="p", channel_type=TELEGRAM, key_expression="message.chat.id", window=secs(2))
    await expect_error(
        f.sched.SetDebounceRule(pb.SetDebounceRuleRequest(rule=rule), metadata=f.worker),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    stored = (await f.sched.SetDebounceRule(pb.SetDebounceRuleRequest(rule=rule), metadata=f.admin)).rule
    assert stored.max_wait.seconds == 20 and stored.mode == pb.DEBOUNCE_MODE_ALL
    listed = (await f.sched.ListDebounceRules(pb.ListDebounceRulesRequest(project_id="p"), metadata=f.worker)).rules
    assert [r.key_expression for r in listed] == ["message.chat.id"]
    delete = pb.DeleteDebounceRuleRequest(project_id="p", channel_type=TELEGRAM)
    assert (await f.sched.DeleteDebounceRule(delete, metadata=f.admin)).deleted
    assert not (await f.sched.DeleteDebounceRule(delete, metadata=f.admin)).deleted
    actions = await db.fetch(
        "SELECT action, details FROM awooop_audit_log"
        " WHERE project_id = 'p' AND action LIKE 'DEBOUNCE%' ORDER BY audit_id"
    )
    assert [a["action"] for a in actions] == ["DEBOUNCE_RULE_SET", "DEBOUNCE_RULE_DELETED"]
    assert json.loads(actions[0]["details"])["max_wait_secs"] == 20


RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def deliver(stub: Any, md: Any, update_id: int, chat: int = 5) -> ingest_pb2.EventOutcome:
    """What a provider does: deliver until answered (a lost answer, a dead ingest, a store
    outage are retried; the event dedupe makes the retries safe)."""
    for _ in range(600):
        try:
            (o,) = (await stub.IngestEvent(tg("p", update_id, chat), metadata=md, timeout=5)).outcomes
            return o
        except grpc.aio.AioRpcError as err:
            if err.code() not in RETRIED:
                raise
            await asyncio.sleep(0.05)  # the provider's retry pace
    raise AssertionError(f"update {update_id} never answered")


async def shorten_and_claim(sched: Any, stub: Any, admin: Any, md: Any, worker: Any, last_id: int) -> pb.ClaimedRun:
    """Sets the rule's window to 0.5 s and delivers one more event: the batch is then due 0.5 s
    after it (an open batch takes the rule it meets), and claimed."""
    await set_rule(sched, admin, "p", window=0.5, max_wait=600)
    await deliver(stub, md, last_id)

    async def claim() -> list[pb.ClaimedRun]:
        req = pb.ClaimRunsRequest(worker_id="w", project_ids=["p"])
        return list((await sched.ClaimRuns(req, metadata=worker)).runs)

    (c,) = await eventually(claim, timeout=15, what="the batch claimed")
    return c


async def api_crash_points(sched: Any, admin: Any, stub: Any, md: Any, proxy: rpc_proxy.RpcProxy) -> str:
    """The same crash points for API-channel events (their dedupe is the idempotency key): a call
    lost before ingest is stored by its retry; a committed call whose answer was lost is replayed.
    Returns their batch's run."""
    rule = pb.DebounceRule(
        project_id="p", channel_type=common_pb2.CHANNEL_TYPE_API, key_expression="to", window=secs(600)
    )
    await sched.SetDebounceRule(pb.SetDebounceRuleRequest(rule=rule), metadata=admin)

    async def call(key: str) -> ingest_pb2.EventOutcome:
        for _ in range(100):
            try:
                (o,) = (await stub.IngestEvent(api_event("p", key, {"to": "ops"}), metadata=md, timeout=5)).outcomes
                return o
            except grpc.aio.AioRpcError as err:
                if err.code() not in RETRIED:
                    raise
        raise AssertionError(f"{key} never answered")

    first = await call("a1")
    proxy.add("IngestEvent", rpc_proxy.fail())
    o = await call("a2")
    assert not o.duplicate and o.run_id == first.run_id
    proxy.add("IngestEvent", rpc_proxy.lose_answer())
    o = await call("a3")
    assert o.duplicate and o.run_id == first.run_id
    o = await call("a3")
    assert o.duplicate and o.run_id == first.run_id
    return first.run_id


async def test_ingest_crash_points_and_a_sigkill_inside_a_window_lose_no_event_and_start_the_run_once(
    start_services, channels, db, make_key, settings: Settings, tmp_path: Path
) -> None:
    """Ingest as a process of its own behind a proxy. Each crash point of an ingest call, made to
    happen: the call lost before it reached ingest (the retry stores it), ingest committed but
    the answer was lost (the retry is a duplicate of the batch's run), answered (a retry is a
    duplicate). Then events keep arriving while ingest is SIGKILLed and started again inside the
    window; every event, answered before the kill or retried after it, is in the one run once, and
    the run is claimed once."""
    rt = await start_services("scheduler")
    sched = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    admin = await make_key("root", {"p": ["admin"]})
    md = await make_key("provider", {"p": ["ingest"]}, "service")
    worker = await make_key("worker", {"p": ["worker"]}, "service")
    await set_rule(sched, admin, "p", window=120, max_wait=600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | settings_env(settings)
    env["AWOOOP_DEBOUNCE_RULE_CACHE_SECONDS"] = "0"
    ing = await spawn_services(["ingest"], env, tmp_path, "ingest")
    port = ing.ports["ingest"]
    proxy = await rpc_proxy.RpcProxy(f"127.0.0.1:{port}").start()
    stub = ingest_pb2_grpc.IngestServiceStub(channels(proxy.port))
    try:
        run_id = (await deliver(stub, md, 1)).run_id
        # before the store call: never reached ingest; its retry is a new event of the batch
        proxy.add("IngestEvent", rpc_proxy.fail())
        o = await deliver(stub, md, 2)
        assert not o.duplicate and o.run_id == run_id and proxy.faulted["IngestEvent"] == 1
        # after the commit, before the answer: the retry is the batch's duplicate
        proxy.add("IngestEvent", rpc_proxy.lose_answer())
        o = await deliver(stub, md, 3)
        assert o.duplicate and o.run_id == run_id and proxy.faulted["IngestEvent"] == 2
        # after the answer: a retry anyway is a duplicate
        o = await deliver(stub, md, 3)
        assert o.duplicate and o.run_id == run_id
        api_run = await api_crash_points(sched, admin, stub, md, proxy)

        answered: list[ingest_pb2.EventOutcome] = []

        async def stream(first: int) -> None:  # a provider's 20 events, one after the other
            for update_id in range(first, first + 20):
                answered.append(await deliver(stub, md, update_id))
                await asyncio.sleep(0.03)  # its pace

        senders = [asyncio.create_task(stream(i)) for i in (10, 30, 50, 70)]
        await eventually(lambda: asyncio.sleep(0, len(answered) >= 5), timeout=20, what="events answered")
        ing.kill()  # SIGKILL, with calls in flight
        at_kill = len(answered)
        ing = await spawn_services(["ingest"], env, tmp_path, "ingest2", fixed={"ingest": port})
        await asyncio.gather(*senders)
        assert at_kill < 80, "the kill came after the stream: it proves nothing"
        assert {o.run_id for o in answered} == {run_id}
        c = await shorten_and_claim(sched, stub, admin, md, worker, 90)
    finally:
        await proxy.stop()
        ing.terminate()
    assert c.run.run_id == run_id and await claimed_once(db, run_id)
    ids, meta = await batch_of(db, run_id)
    assert ids[:3] == [1, 2, 3] and sorted(ids) == [1, 2, 3, *range(10, 91)] and meta["count"] == len(ids)
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE channel_type = 'telegram'") == 1
    api = json.loads((await run_row(db, api_run))["input"])
    assert api["debounce"] == {"key": "ops", "mode": "all", "count": 3} and len(api["events"]) == 3


async def test_a_postgres_restart_inside_a_window_loses_no_acknowledged_event(
    start_services, channels, pg_cluster: PgCluster
) -> None:
    """Events acknowledged before a fast restart of Postgres are in the batch, the events retried
    through the restart join it once, a retry of an acknowledged one is its duplicate; the run
    starts once."""
    dsn = await create_migrated_db(pg_cluster.primary.dsn, "awooop")
    rt = await start_services(
        "ingest", "scheduler", database_url=dsn, debounce_rule_cache_seconds=0, db_connect_timeout=1.0
    )
    admin = await key_on(dsn, "root", {"p": ["admin"]})
    md = await key_on(dsn, "alice", {"p": ["ingest", "worker"]})
    stub = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    sched = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    await set_rule(sched, admin, "p", window=120, max_wait=600)
    before = [await deliver(stub, md, i) for i in range(1, 6)]
    run_id = before[0].run_id
    await asyncio.to_thread(pg_cluster.primary.restart, "fast")
    after = [await deliver(stub, md, i) for i in range(6, 11)]
    again = await deliver(stub, md, 3)
    assert {o.run_id for o in before + after + [again]} == {run_id} and again.duplicate
    c = await shorten_and_claim(sched, stub, admin, md, md, 11)
    conn = await asyncpg.connect(dsn)
    try:
        assert c.run.run_id == run_id and await claimed_once(conn, run_id)
        assert await batch_of(conn, run_id) == (list(range(1, 12)), {"key": "5", "mode": "all", "count": 11})
    finally:
        await conn.close()


def test_the_key_expression_is_a_dotted_path_and_an_event_without_a_value_there_has_no_key() -> None:
    from services.common import debounce_key

    assert debounce_key.parse("message.chat.id") == ("message", "chat", "id")
    assert debounce_key.parse("alerts.0.labels.alertname") == ("alerts", "0", "labels", "alertname")
    for bad in ("", "a..b", ".a", "a.", "a b", "a.b.c.d.e.f.g.h.i", "x" * 65, "a/b", "a.$x", "ä"):
        assert debounce_key.parse(bad) is None, bad
    event = {
        "message": {"chat": {"id": -1001}, "text": "hi"},
        "alerts": [{"labels": {"alertname": "Disk"}}],
        "ok": True,
    }
    key = debounce_key.evaluate
    assert key(("message", "chat", "id"), event) == "-1001"
    assert key(("alerts", "0", "labels", "alertname"), event) == "Disk"
    assert key(("ok",), event) == "true"
    for no_value in (("message", "chat"), ("alerts",), ("missing",), ("alerts", "1", "labels"), ("message", "0")):
        assert key(no_value, event) is None, no_value
    assert key(("n",), {"n": None}) is None
    long = key(("k",), {"k": "x" * 300})
    assert long is not None and long.startswith("sha256:") and len(long) == 71


async def test_webhooks_over_http_an_alertmanager_storm_and_a_line_delivery_are_batched_per_key(
    start_services, channels, db, make_key
) -> None:
    """Real HTTP deliveries: four notifications of one Alertmanager group (mode last) are one run
    carrying the latest and the count, another group its own, a redelivery a duplicate; a LINE
    delivery of three events of two users is two runs (mode all), its redelivery duplicates."""
    f = await serve(start_services, channels, db, make_key, debounce_rule_cache_seconds=0)
    base = f"http://127.0.0.1:{f.rt.http_ports['ingest']}"
    am_secret = (
        await f.ingest.CreateEndpoint(
            ingest_pb2.CreateEndpointRequest(
                project_id="p", channel_type=common_pb2.CHANNEL_TYPE_ALERTMANAGER, name="am"
            ),
            metadata=f.admin,
        )
    ).secret
    await f.ingest.CreateEndpoint(
        ingest_pb2.CreateEndpointRequest(
            project_id="p", channel_type=common_pb2.CHANNEL_TYPE_LINE, name="oa", secret="line-secret"
        ),
        metadata=f.admin,
    )
    for channel, key, mode in (
        (common_pb2.CHANNEL_TYPE_ALERTMANAGER, "groupKey", pb.DEBOUNCE_MODE_LAST),
        (common_pb2.CHANNEL_TYPE_LINE, "source.userId", pb.DEBOUNCE_MODE_ALL),
    ):
        rule = pb.DebounceRule(
            project_id="p", channel_type=channel, key_expression=key, window=secs(1.5), max_wait=secs(60), mode=mode
        )
        await f.sched.SetDebounceRule(pb.SetDebounceRuleRequest(rule=rule), metadata=f.admin)

    async def post(path: str, body: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
        data = json.dumps(body).encode()
        if "line" in path:
            digest = hmac.new(b"line-secret", data, hashlib.sha256).digest()
            headers = {**headers, "X-Line-Signature": base64.b64encode(digest).decode()}
        async with aiohttp.ClientSession() as http, http.post(base + path, data=data, headers=headers) as r:
            assert r.status == 200, await r.text()
            return list((await r.json())["outcomes"])

    def notification(group: str, n: int) -> dict[str, Any]:
        alerts = [{"fingerprint": f"fp{i}", "status": "firing", "startsAt": "2026-12-07T04:00:00Z"} for i in range(n)]
        return {"groupKey": group, "status": "firing", "alerts": alerts}

    auth = {"Authorization": f"Bearer {am_secret}"}
    storm = [(await post("/v1/webhooks/p/alertmanager/am", notification("disk", n), auth))[0] for n in (1, 2, 3, 4)]
    other = (await post("/v1/webhooks/p/alertmanager/am", notification("cpu", 1), auth))[0]
    again = (await post("/v1/webhooks/p/alertmanager/am", notification("disk", 2), auth))[0]
    assert len({o["run_id"] for o in storm}) == 1 and other["run_id"] != storm[0]["run_id"]
    assert again["duplicate"] and again["run_id"] == storm[0]["run_id"]

    def line_event(eid: str, user: str) -> dict[str, Any]:
        return {"webhookEventId": eid, "type": "message", "source": {"type": "user", "userId": user}}

    delivery = {"destination": "x", "events": [line_event("e1", "U1"), line_event("e2", "U2"), line_event("e3", "U1")]}
    line = await post("/v1/webhooks/p/line/oa", delivery, {})
    redelivered = await post("/v1/webhooks/p/line/oa", delivery, {})
    assert line[0]["run_id"] == line[2]["run_id"] != line[1]["run_id"]
    assert [o["run_id"] for o in redelivered] == [o["run_id"] for o in line] and all(
        o["duplicate"] for o in redelivered
    )

    disk = json.loads((await run_row(db, storm[0]["run_id"]))["input"])
    assert disk["debounce"] == {"key": "disk", "mode": "last", "count": 4} and len(disk["events"][0]["alerts"]) == 4
    u1 = json.loads((await run_row(db, line[0]["run_id"]))["input"])
    assert [e["webhookEventId"] for e in u1["events"]] == ["e1", "e3"] and u1["debounce"]["count"] == 2
    claimed: set[str] = set()

    async def all_claimed() -> bool:
        claimed.update(c.run.run_id for c in await f.claim(max_runs=10))
        return len(claimed) == 4

    await eventually(all_claimed, timeout=15, what="the four batches claimed after their windows")


def api_event(project: str, key: str, body: dict[str, Any]) -> ingest_pb2.IngestEventRequest:
    payload = struct_pb2.Struct()
    payload.update(body)
    return ingest_pb2.IngestEventRequest(
        project_id=project, channel_type=common_pb2.CHANNEL_TYPE_API, provider_event_id=key, payload=payload
    )


async def test_api_channel_events_are_batched_by_a_body_field_with_their_idempotency_keys_kept(
    start_services, channels, db, make_key
) -> None:
    """API events keyed by `order.customer`: an IngestEvents batch of three customers' events (one
    customer twice, a key repeated, a key reused with another body), single calls, an HTTP POST and
    concurrent calls. Each customer is one run; a replayed idempotency key answers the batch's run
    as a duplicate; a reused key with another body is that event's IDEMPOTENCY_CONFLICT alone; an
    event without the field is a run of its own."""
    f = await serve(start_services, channels, db, make_key, debounce_rule_cache_seconds=0)
    rule = pb.DebounceRule(
        project_id="p",
        channel_type=common_pb2.CHANNEL_TYPE_API,
        key_expression="order.customer",
        window=secs(1.5),
        max_wait=secs(60),
    )
    await f.sched.SetDebounceRule(pb.SetDebounceRuleRequest(rule=rule), metadata=f.admin)

    def body(customer: str | None, n: int) -> dict[str, Any]:
        return {"order": {"customer": customer, "n": n}} if customer else {"order": {"n": n}}

    batch = [
        api_event("p", "k1", body("ann", 1)),
        api_event("p", "k2", body("bob", 2)),
        api_event("p", "k3", body("ann", 3)),
        api_event("p", "k1", body("ann", 1)),  # the same key and body again: a replay
        api_event("p", "k2", body("bob", 99)),  # the same key, another body: refused alone
        api_event("p", "k4", body(None, 4)),  # no customer: not debounced
    ]
    resp = await f.ingest.IngestEvents(ingest_pb2.IngestEventsRequest(events=batch), metadata=f.creator)
    r = resp.results
    ann, bob, plain = r[0].outcomes[0].run_id, r[1].outcomes[0].run_id, r[5].outcomes[0].run_id
    assert len({ann, bob, plain}) == 3 and r[2].outcomes[0].run_id == ann
    assert r[3].outcomes[0].duplicate and r[3].outcomes[0].run_id == ann
    assert r[4].error.code == grpc.StatusCode.ALREADY_EXISTS.value[0] and not r[4].outcomes
    # single calls (and their replays) join the open batches
    assert (await send(f, api_event("p", "k5", body("ann", 5)))).run_id == ann
    replay = await send(f, api_event("p", "k3", body("ann", 3)))
    assert replay.duplicate and replay.run_id == ann
    base = f"http://127.0.0.1:{f.rt.http_ports['ingest']}"
    headers = {"Authorization": f.creator[0][1], "Idempotency-Key": "k6"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base}/v1/projects/p/events", json=body("bob", 6), headers=headers) as answer,
    ):
        assert answer.status == 200 and (await answer.json())["outcomes"][0]["run_id"] == bob
    # concurrent calls of one customer, each with its key: one batch
    outcomes = await asyncio.gather(*(send(f, api_event("p", f"c{i}", body("cid", i))) for i in range(30)))
    assert len({o.run_id for o in outcomes}) == 1 and not any(o.duplicate for o in outcomes)

    ids = [e["order"]["n"] for e in json.loads((await run_row(db, ann))["input"])["events"]]
    assert ids == [1, 3, 5]
    bob_input = json.loads((await run_row(db, bob))["input"])
    assert [e["order"]["n"] for e in bob_input["events"]] == [2, 6] and bob_input["debounce"]["key"] == "bob"
    cid = json.loads((await run_row(db, outcomes[0].run_id))["input"])
    assert sorted(e["order"]["n"] for e in cid["events"]) == list(range(30)) and cid["debounce"]["count"] == 30
    claimed: set[str] = set()

    async def all_claimed() -> bool:
        claimed.update(c.run.run_id for c in await f.claim(max_runs=10))
        return claimed == {ann, bob, plain, outcomes[0].run_id}

    await eventually(all_claimed, timeout=15, what="the batches claimed after their windows")
    for run_id in claimed:
        assert await claimed_once(db, run_id)


async def test_a_full_batch_is_due_at_once_and_the_next_event_opens_another(
    start_services, channels, db, make_key, monkeypatch
) -> None:
    """A batch that took MAX_BATCH_EVENTS events (3 here) is claimable at once, its window closed;
    the key's next events open the next batch, which waits for its window."""
    monkeypatch.setattr(debounce, "MAX_BATCH_EVENTS", 3)
    f = await serve(start_services, channels, db, make_key, debounce_rule_cache_seconds=0)
    await set_rule(f.sched, f.admin, "p", window=600, max_wait=3600)
    runs = [(await send(f, tg("p", i, 8))).run_id for i in range(1, 6)]
    assert runs[0] == runs[1] == runs[2] != runs[3] == runs[4]
    (c,) = await f.claim(max_runs=5)
    assert c.run.run_id == runs[0] and (await batch_of(db, runs[0]))[1]["count"] == 3
    assert (await run_row(db, runs[3]))["wait_reason"] == "debounce"


async def test_a_batch_input_stays_within_the_payload_limit(start_services, channels, db, make_key) -> None:
    """Events of ~500 bytes under AWOOOP_MAX_PAYLOAD_BYTES = 2000 (one IngestEvents call of six,
    then single events): each batch's input stays within 2,000 bytes, the full ones are due at
    once, no event is lost or doubled."""
    f = await serve(start_services, channels, db, make_key, debounce_rule_cache_seconds=0, max_payload_bytes=2000)
    await set_rule(f.sched, f.admin, "p", window=600, max_wait=3600)

    def big(update_id: int) -> ingest_pb2.IngestEventRequest:
        req = tg("p", update_id, 3)
        req.payload["message"]["text"] = "x" * 450
        return req

    resp = await f.ingest.IngestEvents(
        ingest_pb2.IngestEventsRequest(events=[big(i) for i in range(1, 7)]), metadata=f.creator
    )
    runs = [r.outcomes[0].run_id for r in resp.results] + [(await send(f, big(i))).run_id for i in range(7, 11)]
    assert len(set(runs)) >= 3
    seen = []
    for run_id in dict.fromkeys(runs):
        text = await db.fetchval("SELECT input::text FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id))
        assert len(text.encode()) <= 2000, len(text)
        ids, meta = await batch_of(db, run_id)
        assert meta["count"] == len(ids) == runs.count(run_id)
        seen += ids
    assert seen == list(range(1, 11))
    full = await f.claim(max_runs=10)  # every batch but the last is due at once
    assert sorted(c.run.run_id for c in full) == sorted(set(runs) - {runs[-1]})


async def test_events_racing_the_claim_of_their_batch_each_land_in_exactly_one_run(
    start_services, channels, db, make_key
) -> None:
    """A window of 50 ms (max wait 200 ms), four senders of one chat and a worker claiming all the
    while: a batch is claimed while events of its key keep arriving. Every event is in exactly one
    run, and no run's input changed after its claim (what the worker got is all it holds)."""
    f = await serve(start_services, channels, db, make_key, debounce_rule_cache_seconds=0)
    await set_rule(f.sched, f.admin, "p", window=0.05, max_wait=0.2)
    got: dict[str, list[int]] = {}  # run -> the update ids its input held when claimed
    done = asyncio.Event()
    during: list[str] = []  # runs claimed while the senders were still sending

    async def sender(first: int) -> None:
        for update_id in range(first, first + 50):
            await send(f, tg("p", update_id, 4))
            await asyncio.sleep(0.002 * (update_id % 7))  # uneven gaps, some longer than none

    async def worker() -> None:
        pending = "SELECT count(*) FROM awooop_run_state WHERE status = 'PENDING'"
        while not done.is_set() or await db.fetchval(pending):
            for c in await f.claim(max_runs=10):
                got[c.run.run_id] = [int(e["update_id"]) for e in MessageToDict(c.run.input)["events"]]
                if not done.is_set():
                    during.append(c.run.run_id)
                await f.sched.CompleteRun(pb.CompleteRunRequest(lease=c.lease), metadata=f.worker)
            await asyncio.sleep(0.01)

    claiming = asyncio.create_task(worker())
    await asyncio.gather(*(sender(i) for i in (1, 51, 101, 151)))
    done.set()
    await asyncio.wait_for(claiming, 30)
    assert len(got) > 1 and during  # the stream was cut into batches, claimed as they came due
    assert sorted(i for ids in got.values() for i in ids) == list(range(1, 201))
    for run_id, ids in got.items():
        assert (await batch_of(db, run_id))[0] == ids and await claimed_once(db, run_id)
