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
import datetime as dt
import json
import os
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import grpc
from google.protobuf import struct_pb2
from google.protobuf.duration_pb2 import Duration

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common import errors
from services.common.settings import Settings
from services.ingest.debounce import batch_input
from tests.harness import rpc_proxy
from tests.harness.flow import Flow, serve
from tests.harness.helpers import eventually, expect_error, settings_env, spawn_services
from tests.harness.infra import key_on
from tests.harness.pgcluster import PgCluster
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
