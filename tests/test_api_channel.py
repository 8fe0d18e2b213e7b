"""The API channel on seed 003's rules, over gRPC (IngestEvent with channel API) and HTTP
(POST /v1/projects/{project_id}/events): per-principal keys, payload fingerprint conflicts,
membership re-checked at once on replay (no window from the API-key cache), ten parallel
requests with one key -> one run, keys stored by the old channel-dedupe rule still working, and an
IngestEvents batch answering a refused API event in its own result."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from typing import Any

import aiohttp
import grpc
from google.rpc import error_details_pb2, status_pb2

from awooop.common.v1 import common_pb2 as CH
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from services.common import principals
from tests.harness.helpers import expect_error
from tests.harness.saga import struct

PROJECT = "apich"


async def setup(start_services, channels, make_key):  # type: ignore[no-untyped-def]
    # a long key cache: a revocation must still be honoured on the very next replay
    rt = await start_services("ingest", auth_cache_seconds=300)
    stub = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    alice = await make_key("alice", {PROJECT: ["ingest"]})
    bob = await make_key("bob", {PROJECT: ["ingest"]})
    return rt, stub, alice, bob, f"http://127.0.0.1:{rt.http_ports['ingest']}/v1/projects/{PROJECT}/events"


async def send(url: str, md: Any, key: str | None, body: Any) -> tuple[int, dict[str, str], Any]:
    headers = {"Authorization": dict(md)["authorization"]} if md else {}
    if key is not None:
        headers["Idempotency-Key"] = key
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as http, http.post(url, data=data, headers=headers) as r:
        return r.status, dict(r.headers), await r.json(content_type=None)


def api_event(payload: dict[str, Any]) -> ingest_pb2.IngestEventRequest:
    return ingest_pb2.IngestEventRequest(project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_API, payload=struct(payload))


async def test_http_events_seed_003_rules(start_services, channels, make_key, db) -> None:
    _rt, _stub, alice, bob, url = await setup(start_services, channels, make_key)
    status, _, first = await send(url, alice, "order-42", {"ask": "refund", "order": 42})
    assert status == 200
    run = first["outcomes"][0]
    assert run["provider_event_id"] == "order-42" and not run["duplicate"]
    # a retry: the same run, a duplicate (key order in the JSON does not matter)
    status, _, again = await send(url, alice, "order-42", {"order": 42, "ask": "refund"})
    assert status == 200 and again["outcomes"][0] == {**run, "duplicate": True, "code": "E-IDEMPOTENT-001"}
    # another payload with the same key: 409 naming the conflict
    status, hdrs, doc = await send(url, alice, "order-42", {"ask": "refund", "order": 43})
    assert status == 409 and hdrs["Content-Type"].startswith("application/problem+json")
    assert doc["reason"] == "IDEMPOTENCY_CONFLICT"
    # another principal's same key is its own key: a new run, never alice's
    status, _, other = await send(url, bob, "order-42", {"ask": "refund", "order": 42})
    assert status == 200 and not other["outcomes"][0]["duplicate"]
    assert other["outcomes"][0]["run_id"] != run["run_id"]
    # revoked: the replay is refused at once, although the key cache still trusts alice
    await principals.revoke_role(db, "alice", PROJECT)
    status, _, doc = await send(url, alice, "order-42", {"ask": "refund", "order": 42})
    assert status == 403 and doc["reason"] == "FORBIDDEN"
    # the request's own problems
    assert (await send(url, None, "k", {}))[0] == 401
    assert (await send(url, (("authorization", "Bearer awk_nope_nope"),), "k", {}))[0] == 401
    status, _, doc = await send(url, bob, None, {"a": 1})
    assert status == 400 and doc["invalid_params"][0]["name"] == "headers.Idempotency-Key"
    status, _, doc = await send(url, bob, "k2", b"[1]")
    assert status == 400 and doc["invalid_params"][0]["name"] == "body"
    outsider = await make_key("carol", {"elsewhere": ["ingest"]})
    assert (await send(url, outsider, "k3", {"a": 1}))[0] == 403
    rows = await db.fetch("SELECT created_by FROM awooop_run_state ORDER BY created_by")
    assert [r["created_by"] for r in rows] == ["alice", "bob"]


async def test_grpc_api_channel_same_rules(start_services, channels, make_key, db) -> None:
    _rt, stub, alice, bob, url = await setup(start_services, channels, make_key)
    key = (("idempotency-key", "job-1"),)
    first = (await stub.IngestEvent(api_event({"n": 1}), metadata=(*alice, *key))).outcomes[0]
    again = (await stub.IngestEvent(api_event({"n": 1}), metadata=(*alice, *key))).outcomes[0]
    assert again.duplicate and again.run_id == first.run_id
    # the HTTP path and the gRPC path share the key: one API channel
    status, _, doc = await send(url, alice, "job-1", {"n": 1})
    assert status == 200 and doc["outcomes"][0]["run_id"] == first.run_id and doc["outcomes"][0]["duplicate"]
    await expect_error(
        stub.IngestEvent(api_event({"n": 2}), metadata=(*alice, *key)),
        grpc.StatusCode.ALREADY_EXISTS,
        "IDEMPOTENCY_CONFLICT",
    )
    theirs = (await stub.IngestEvent(api_event({"n": 1}), metadata=(*bob, *key))).outcomes[0]
    assert not theirs.duplicate and theirs.run_id != first.run_id
    await principals.revoke_role(db, "alice", PROJECT)
    await expect_error(
        stub.IngestEvent(api_event({"n": 1}), metadata=(*alice, *key)), grpc.StatusCode.PERMISSION_DENIED, "FORBIDDEN"
    )


async def test_ten_parallel_requests_one_key_one_run(start_services, channels, make_key, db) -> None:
    _rt, _stub, alice, _bob, url = await setup(start_services, channels, make_key)
    answers = await asyncio.gather(*(send(url, alice, "burst", {"x": 1}) for _ in range(10)))
    assert [a[0] for a in answers] == [200] * 10
    outcomes = [a[2]["outcomes"][0] for a in answers]
    assert len({o["run_id"] for o in outcomes}) == 1
    assert sum(not o["duplicate"] for o in outcomes) == 1
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == 1


async def test_keys_stored_by_the_old_channel_dedupe_rule_keep_working(start_services, channels, make_key, db) -> None:
    _rt, stub, alice, bob, _url = await setup(start_services, channels, make_key)
    # what the previous release wrote for alice's API event with key "legacy-1"
    run_id = await db.fetchval(
        """WITH r AS (INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, input, max_attempts,
                                                      created_by)
                      VALUES ($1, 'api', 'legacy-1', '{"n": 1}', 3, 'alice') RETURNING run_id)
           INSERT INTO awooop_channel_event_dedupe (project_id, channel_type, provider_event_id, run_id)
           SELECT $1, 'api', 'legacy-1', run_id FROM r RETURNING run_id""",
        PROJECT,
    )
    key = (("idempotency-key", "legacy-1"),)
    for _ in range(2):  # the first replay records the key; the second takes the ordinary path
        out = (await stub.IngestEvent(api_event({"n": 1}), metadata=(*alice, *key))).outcomes[0]
        assert out.duplicate and out.run_id == str(run_id)
    await expect_error(
        stub.IngestEvent(api_event({"n": 9}), metadata=(*alice, *key)),
        grpc.StatusCode.ALREADY_EXISTS,
        "IDEMPOTENCY_CONFLICT",
    )
    # not bob's run
    theirs = (await stub.IngestEvent(api_event({"n": 1}), metadata=(*bob, *key))).outcomes[0]
    assert not theirs.duplicate and theirs.run_id != str(run_id)


async def test_http_events_take_not_before_priority_and_a_key_from_the_query(
    start_services, channels, make_key, db
) -> None:
    _, _, alice, _, url = await setup(start_services, channels, make_key)
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).replace(microsecond=0)
    query = f"?not_before={later.isoformat().replace('+00:00', 'Z')}&priority=7"
    query += "&concurrency_key=k8s:deployment/api&concurrency_key=llm:x"
    status, _, doc = await send(url + query, alice, "delayed-1", {"ask": "scale"})
    assert status == 200, doc
    row = await db.fetchrow(
        "SELECT not_before, priority, wait_reason, concurrency_keys FROM awooop_run_state WHERE run_id = $1",
        uuid.UUID(doc["outcomes"][0]["run_id"]),
    )
    assert (row["not_before"], row["priority"], row["wait_reason"], row["concurrency_keys"]) == (
        later,
        7,
        "delayed",
        ["k8s:deployment/api", "llm:x"],  # the key repeats, one per key
    )
    before = await db.fetchval("SELECT count(*) FROM awooop_run_state")
    for bad, field in (("?not_before=tomorrow", "query.not_before"), ("?priority=5000", "query.priority")):
        status, _, doc = await send(url + bad, alice, f"bad-{field}", {"ask": "scale"})
        assert status == 400 and doc["invalid_params"][0]["name"] == field, doc
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == before  # refused: nothing stored


def error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo:
    (detail,) = [d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    info = error_details_pb2.ErrorInfo()
    detail.Unpack(info)
    return info


async def test_a_refused_api_event_answers_alone_in_a_batch(start_services, channels, make_key, db) -> None:
    _rt, stub, alice, _bob, _url = await setup(start_services, channels, make_key)
    await stub.IngestEvent(api_event({"n": 1}), metadata=(*alice, ("idempotency-key", "used")))

    def keyed(key: str, payload: dict[str, Any]) -> ingest_pb2.IngestEventRequest:
        event = api_event(payload)
        event.provider_event_id = key
        return event

    telegram = ingest_pb2.IngestEventRequest(
        project_id=PROJECT, channel_type=CH.CHANNEL_TYPE_TELEGRAM, payload=struct({"update_id": 5})
    )
    batch = ingest_pb2.IngestEventsRequest(events=[keyed("fresh", {"n": 7}), keyed("used", {"n": 2}), telegram])
    first = (await stub.IngestEvents(batch, metadata=alice)).results
    new, conflict, other = first
    assert [o.duplicate for o in (*new.outcomes, *other.outcomes)] == [False, False]
    assert not new.HasField("error") and not other.HasField("error")
    assert not conflict.outcomes and conflict.error.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
    info = error_info(conflict.error)
    assert info.reason == "IDEMPOTENCY_CONFLICT" and info.domain == "awooop"
    assert info.metadata["differs"] == "fingerprint" and info.metadata["operation"] == "ingest.IngestEvent"
    assert "first_seen_at" in info.metadata and "different fingerprint" in conflict.error.message
    runs = {new.outcomes[0].run_id, other.outcomes[0].run_id}
    # the earlier IngestEvent's run and the two new ones; nothing for the refused event
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == 3
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE run_id = ANY($1::uuid[])", list(runs)) == 2

    # the retry answers the same: the stored ones as duplicates of the same runs, the refusal again
    again = (await stub.IngestEvents(batch, metadata=alice)).results
    assert [(o.run_id, o.duplicate) for r in (again[0], again[2]) for o in r.outcomes] == [
        (new.outcomes[0].run_id, True),
        (other.outcomes[0].run_id, True),
    ]
    assert error_info(again[1].error).reason == "IDEMPOTENCY_CONFLICT" and not again[1].outcomes
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == 3

    # a revoked caller (its cached key still carries the role): its replay is refused alone
    await principals.revoke_role(db, "alice", PROJECT)
    batch.events[2].payload.update({"update_id": 6})  # the batch holds a copy
    revoked = (await stub.IngestEvents(batch, metadata=alice)).results
    for refused in revoked[:2]:
        assert refused.error.code == grpc.StatusCode.PERMISSION_DENIED.value[0] and not refused.outcomes
        assert error_info(refused.error).reason == "FORBIDDEN"
    assert not revoked[2].outcomes[0].duplicate
    # a single IngestEvent still raises the refusal
    await expect_error(
        stub.IngestEvent(keyed("used", {"n": 2}), metadata=alice), grpc.StatusCode.PERMISSION_DENIED, "FORBIDDEN"
    )
