"""Bulk API submission (issue 29): the API-channel events of an IngestEvents batch are stored in
one statement, with every seed-003 rule kept per event, against a real ingest server, Postgres
and Redis: one transaction for the whole batch, ten parallel batches sharing a key -> one run and
nine duplicates, batches sharing keys in different orders, a request that meets a key another
one is still storing (it waits, then replays; or claims the key if that one rolls back), repeats
of a key inside one batch, an expired key, old-rule keys repeated in a batch, and per-principal
keys under concurrency."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import asyncpg
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2, status_pb2

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from services.ingest.api_channel import OPERATION, fingerprint
from tests.harness.helpers import eventually, lock_waiters

PROJECT = "bulk"


async def serve(start_services, channels, make_key):  # type: ignore[no-untyped-def]
    # a long API-key cache: a revocation must still be honoured on the very next replay
    rt = await start_services("ingest", auth_cache_seconds=300)
    stub = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    alice = await make_key("alice", {PROJECT: ["ingest"]})
    return stub, alice


def event(key: str, payload: dict[str, Any]) -> ingest_pb2.IngestEventRequest:
    s = struct_pb2.Struct()
    s.update(payload)
    return ingest_pb2.IngestEventRequest(
        project_id=PROJECT, channel_type=common_pb2.CHANNEL_TYPE_API, provider_event_id=key, payload=s
    )


def batch(*events: ingest_pb2.IngestEventRequest) -> ingest_pb2.IngestEventsRequest:
    return ingest_pb2.IngestEventsRequest(events=list(events))


def reason(status: status_pb2.Status) -> str:
    for d in status.details:
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            return info.reason
    return ""


def answers(response: ingest_pb2.IngestEventsResponse) -> list[tuple[str, bool] | str]:
    """Per delivery: (run_id, duplicate), or the refusal's reason."""
    out: list[tuple[str, bool] | str] = []
    for r in response.results:
        if r.HasField("error"):
            assert not r.outcomes
            out.append(reason(r.error))
        else:
            (o,) = r.outcomes
            out.append((o.run_id, o.duplicate))
    return out


async def test_a_batch_of_api_events_is_one_transaction(start_services, channels, make_key, db) -> None:
    stub, alice = await serve(start_services, channels, make_key)
    n = 128
    first = answers(await stub.IngestEvents(batch(*(event(f"k{i}", {"n": i}) for i in range(n))), metadata=alice))
    assert all(isinstance(a, tuple) and not a[1] for a in first) and len({a[0] for a in first}) == n
    # every run, its history row (its log's first state row) and its key row were written by one
    # transaction: one xmin for the runs and keys, and one for the history rows, which the log's
    # writer inserts in a block of that transaction (a subtransaction, migration 0420: its id is
    # taken after the transaction's, and it commits only with it)
    xmins = await db.fetch(
        "SELECT xmin::text FROM awooop_run_state UNION SELECT xmin::text FROM awooop_idempotency_key"
    )
    assert len(xmins) == 1
    logged = await db.fetch("SELECT DISTINCT xmin::text FROM awooop_run_event")
    assert len(logged) == 1 and int(logged[0][0]) > int(xmins[0][0])
    assert await db.fetchval("SELECT count(*) FROM awooop_audit_log WHERE action = 'RUN_CREATED'") == n
    # in the order sent: the claim hands out the oldest first
    order = await db.fetch("SELECT provider_event_id FROM awooop_run_state ORDER BY created_at")
    assert [r["provider_event_id"] for r in order] == [f"k{i}" for i in range(n)]
    keys = await db.fetch(
        "SELECT key, resource_id, principal_id, operation FROM awooop_idempotency_key ORDER BY resource_id"
    )
    assert {(r["principal_id"], r["operation"]) for r in keys} == {("alice", "ingest.IngestEvent")}
    assert sorted(r["resource_id"] for r in keys) == sorted(a[0] for a in first if isinstance(a, tuple))
    # the retry of the whole batch replays every event, and writes nothing
    again = answers(await stub.IngestEvents(batch(*(event(f"k{i}", {"n": i}) for i in range(n))), metadata=alice))
    assert again == [(a[0], True) for a in first if isinstance(a, tuple)]
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == n
    assert len(await db.fetch("SELECT DISTINCT xmin::text FROM awooop_idempotency_key")) == 1


async def test_ten_parallel_batches_sharing_a_key_make_one_run_and_nine_duplicates(
    start_services, channels, make_key, db
) -> None:
    stub, alice = await serve(start_services, channels, make_key)
    calls = [
        stub.IngestEvents(batch(event(f"own-{c}", {"c": c}), event("shared", {"x": 1})), metadata=alice)
        for c in range(10)
    ]
    got = [answers(r) for r in await asyncio.gather(*calls)]  # no call fails: no unique violation leaks
    own, shared = [g[0] for g in got], [g[1] for g in got]
    assert all(isinstance(a, tuple) and not a[1] for a in own)
    assert len({a[0] for a in shared if isinstance(a, tuple)}) == 1 and len(shared) == 10
    assert sorted(a[1] for a in shared if isinstance(a, tuple)) == [False] + [True] * 9
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE provider_event_id = 'shared'") == 1
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == 11


async def test_parallel_same_key_with_two_payloads_one_run_the_rest_replay_or_conflict(
    start_services, channels, make_key, db
) -> None:
    stub, alice = await serve(start_services, channels, make_key)
    payloads = [{"v": i % 2} for i in range(10)]
    got = await asyncio.gather(*(stub.IngestEvents(batch(event("k", p)), metadata=alice) for p in payloads))
    (run_id,) = await db.fetch("SELECT run_id, input FROM awooop_run_state")
    winner = json.loads(run_id["input"]) if isinstance(run_id["input"], str) else run_id["input"]
    for p, r in zip(payloads, got, strict=True):
        (a,) = answers(r)
        if p == winner:
            assert isinstance(a, tuple) and a[0] == str(run_id["run_id"])
        else:
            assert a == "IDEMPOTENCY_CONFLICT"
    created = [a for r in got for a in answers(r) if isinstance(a, tuple) and not a[1]]
    assert len(created) == 1


async def test_batches_sharing_keys_in_different_orders_neither_deadlock_nor_duplicate(
    start_services, channels, make_key, db
) -> None:
    stub, alice = await serve(start_services, channels, make_key)
    keys = [f"k{i}" for i in range(40)]
    orders = [random.Random(seed).sample(keys, len(keys)) for seed in range(6)]
    got = await asyncio.gather(
        *(stub.IngestEvents(batch(*(event(k, {"k": k}) for k in order)), metadata=alice) for order in orders)
    )
    by_key: dict[str, list[tuple[str, bool]]] = {}
    for order, r in zip(orders, got, strict=True):
        for k, a in zip(order, answers(r), strict=True):
            assert isinstance(a, tuple), a
            by_key.setdefault(k, []).append(a)
    for k, seen in by_key.items():
        assert len({run for run, _ in seen}) == 1, k
        assert sorted(dup for _, dup in seen) == [False] + [True] * 5, k
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == 40


async def _store_key_uncommitted(db: asyncpg.Connection, key: str) -> tuple[asyncpg.transaction.Transaction, str]:
    """Another request storing alice's `key` with payload {"x": 1}: its run and key row written in
    an open transaction of the test's connection, as the engine would write them."""
    tx = db.transaction()
    await tx.start()
    run_id = str(
        await db.fetchval(
            """INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, input, max_attempts,
                                             created_by)
               VALUES ($1, 'api', $2, '{"x": 1}', 3, 'alice') RETURNING run_id""",
            PROJECT,
            key,
        )
    )
    await db.execute(
        """INSERT INTO awooop_idempotency_key (project_id, principal_type, principal_id, operation, key,
                                              request_fingerprint, policy_version, response_snapshot, resource_id,
                                              expires_at)
           VALUES ($1, 'user', 'alice', $2, $3, $4, 'v1', $5, $6, now() + interval '1 hour')""",
        PROJECT,
        OPERATION,
        key,
        fingerprint(PROJECT, {"x": 1}, 0),  # IngestEvent without max_attempts: 0, the policy decides
        json.dumps({"run_id": run_id, "legacy": False}).encode(),
        run_id,
    )
    return tx, run_id


async def test_a_key_still_being_stored_is_waited_for_then_replayed(start_services, channels, make_key, db) -> None:
    stub, alice = await serve(start_services, channels, make_key)
    tx, run_id = await _store_key_uncommitted(db, "inflight")
    call = asyncio.ensure_future(
        stub.IngestEvents(batch(event("fresh", {"y": 2}), event("inflight", {"x": 1})), metadata=alice)
    )
    await eventually(lambda: _waiting(db), what="the batch waits on the key another request is storing")
    assert not call.done()
    await tx.commit()
    fresh, inflight = answers(await call)
    # committed after the batch's statement began: the second statement's snapshot replays it
    assert inflight == (run_id, True)
    assert isinstance(fresh, tuple) and not fresh[1]
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == 2


async def test_a_key_whose_first_request_rolls_back_is_claimed_by_the_waiter(
    start_services, channels, make_key, db
) -> None:
    stub, alice = await serve(start_services, channels, make_key)
    tx, run_id = await _store_key_uncommitted(db, "inflight")
    call = asyncio.ensure_future(stub.IngestEvents(batch(event("inflight", {"x": 1})), metadata=alice))
    await eventually(lambda: _waiting(db), what="the batch waits on the key another request is storing")
    await tx.rollback()
    ((new_run, duplicate),) = answers(await call)  # type: ignore[misc]
    assert not duplicate and new_run != run_id
    assert [str(r["run_id"]) for r in await db.fetch("SELECT run_id FROM awooop_run_state")] == [new_run]


async def _waiting(db: asyncpg.Connection) -> bool:
    return await lock_waiters(db) == 1


async def test_repeats_of_a_key_in_one_batch_answer_as_if_sent_one_after_another(
    start_services, channels, make_key, db
) -> None:
    stub, alice = await serve(start_services, channels, make_key)
    got = answers(
        await stub.IngestEvents(
            batch(
                event("dup", {"a": 1}),
                event("other", {"b": 1}),
                event("dup", {"a": 1}),  # a replay of the first
                event("dup", {"a": 2}),  # another payload: a conflict, alone
            ),
            metadata=alice,
        )
    )
    first, other, again, conflict = got
    assert isinstance(first, tuple) and not first[1] and again == (first[0], True)
    assert isinstance(other, tuple) and not other[1]
    assert conflict == "IDEMPOTENCY_CONFLICT"
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == 2
    # a key the store already holds, repeated: both replay (or both conflict)
    got = answers(
        await stub.IngestEvents(
            batch(event("dup", {"a": 2}), event("dup", {"a": 1}), event("dup", {"a": 1})), metadata=alice
        )
    )
    assert got == ["IDEMPOTENCY_CONFLICT", (first[0], True), (first[0], True)]


async def test_an_expired_key_in_a_batch_creates_a_new_run(start_services, channels, make_key, db) -> None:
    stub, alice = await serve(start_services, channels, make_key)
    ((old, _),) = answers(await stub.IngestEvents(batch(event("k", {"a": 1})), metadata=alice))  # type: ignore[misc]
    await db.execute("UPDATE awooop_idempotency_key SET expires_at = now() - interval '1 second'")
    # the expired key starts afresh, even with another payload: no conflict with what expired
    ((new, duplicate),) = answers(await stub.IngestEvents(batch(event("k", {"a": 2})), metadata=alice))  # type: ignore[misc]
    assert not duplicate and new != old
    row = await db.fetchrow("SELECT resource_id, expires_at > now() AS live FROM awooop_idempotency_key")
    assert row["resource_id"] == new and row["live"]
    assert answers(await stub.IngestEvents(batch(event("k", {"a": 2})), metadata=alice)) == [(new, True)]


async def test_old_rule_keys_repeated_in_a_batch(start_services, channels, make_key, db) -> None:
    stub, alice = await serve(start_services, channels, make_key)
    # what a release before per-principal keys wrote for alice's API event "legacy-1"
    run_id = str(
        await db.fetchval(
            """WITH r AS (INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, input,
                                                          max_attempts, created_by)
                          VALUES ($1, 'api', 'legacy-1', '{"n": 1}', 3, 'alice') RETURNING run_id)
               INSERT INTO awooop_channel_event_dedupe (project_id, channel_type, provider_event_id, run_id)
               SELECT $1, 'api', 'legacy-1', run_id FROM r RETURNING run_id""",
            PROJECT,
        )
    )
    got = answers(
        await stub.IngestEvents(
            batch(event("legacy-1", {"n": 2}), event("legacy-1", {"n": 1}), event("legacy-1", {"n": 1})),
            metadata=alice,
        )
    )
    assert got == ["IDEMPOTENCY_CONFLICT", (run_id, True), (run_id, True)]
    # the replay recorded the key: the next one takes the ordinary path, to the same run
    assert await db.fetchval("SELECT resource_id FROM awooop_idempotency_key WHERE key = 'legacy-1'") == run_id
    assert answers(await stub.IngestEvents(batch(event("legacy-1", {"n": 1})), metadata=alice)) == [(run_id, True)]
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == 1


async def test_two_principals_sending_one_key_in_parallel_get_a_run_each(
    start_services, channels, make_key, db
) -> None:
    stub, alice = await serve(start_services, channels, make_key)
    bob = await make_key("bob", {PROJECT: ["ingest"]})
    callers = [alice, bob] * 5
    got = await asyncio.gather(*(stub.IngestEvents(batch(event("k", {"a": 1})), metadata=md) for md in callers))
    runs: dict[int, set[str]] = {0: set(), 1: set()}
    for n, r in enumerate(got):
        ((run, _),) = answers(r)  # type: ignore[misc]
        runs[n % 2].add(run)
    assert len(runs[0]) == len(runs[1]) == 1 and runs[0] != runs[1]
    created_by = await db.fetch("SELECT created_by FROM awooop_run_state ORDER BY created_by")
    assert [r["created_by"] for r in created_by] == ["alice", "bob"]


async def test_a_revoked_caller_is_refused_per_event_and_its_new_keys_still_stored(
    start_services, channels, make_key, db
) -> None:
    stub, alice = await serve(start_services, channels, make_key)
    ((run, _),) = answers(await stub.IngestEvents(batch(event("old", {"a": 1})), metadata=alice))  # type: ignore[misc]
    # revoked in the store while the service's API-key cache still trusts alice's roles
    await db.execute("DELETE FROM awooop_project_member WHERE principal_id = 'alice'")
    got = answers(await stub.IngestEvents(batch(event("old", {"a": 1}), event("new", {"b": 1})), metadata=alice))
    # the replay re-checks membership (FORBIDDEN, nothing from the snapshot); a first request
    # is authorized by the call's own role check, as before
    assert got[0] == "FORBIDDEN"
    assert isinstance(got[1], tuple) and not got[1][1] and got[1][0] != run
