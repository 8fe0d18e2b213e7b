"""Idempotent mutations (seed 003) through CreateRun and the reusable engine
(services/common/idempotency.py), against real Postgres and real gRPC servers."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg
import grpc
import pytest
from google.protobuf import struct_pb2

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from services.common import errors, idempotency, principals
from services.common.runs import RUN_READY_CHANNEL
from services.ingest import retention
from services.ingest.create_run import OPERATION
from tests.harness.helpers import eventually, expect_error

# --- helpers shared by the tests of this module ---------------------------------------------

PROJECT = "proj"


def struct(data: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data)
    return s


def create(key: str = "key-1", project: str = PROJECT, **input_: Any) -> ingest_pb2.CreateRunRequest:
    return ingest_pb2.CreateRunRequest(project_id=project, idempotency_key=key, input=struct(input_ or {"task": "x"}))


async def serve(start_services, channels, make_key, principal: str = "alice", **overrides: Any):  # type: ignore[no-untyped-def]
    """(runtime, stub, metadata) for a fresh ingest server and a caller with the ingest role."""
    rt = await start_services("ingest", **overrides)
    md = await make_key(principal, {PROJECT: ["ingest"]})
    return rt, ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"])), md


async def runs(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM awooop_run_state"))


def lock_name(principal_id: str, key: str) -> str:
    return idempotency.Scope(PROJECT, "user", principal_id, OPERATION, key).lock_name()


async def hold_lock(db: asyncpg.Connection, name: str) -> asyncpg.transaction.Transaction:
    """Takes the scope's advisory lock in an open transaction of the test's own connection."""
    tx = db.transaction()
    await tx.start()
    await db.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", name)
    return tx


async def lock_waiters(db: asyncpg.Connection) -> int:
    return int(
        await db.fetchval(
            """SELECT count(*) FROM pg_locks
                WHERE locktype = 'advisory' AND NOT granted
                  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
        )
    )


# --- seed 003 acceptance tests ---------------------------------------------------------------


async def test_ten_parallel_identical_create_run_calls_create_one_run_and_nine_replays(
    start_services, channels, make_key, db, db_dsn
) -> None:
    # (a pool with room for all ten to wait at once)
    _rt, stub, md = await serve(start_services, channels, make_key, db_pool_max=20)
    # hold the key's lock so all ten are provably in flight together, then let them go
    holder = await asyncpg.connect(db_dsn)
    tx = await hold_lock(holder, lock_name("alice", "key-1"))
    calls = [asyncio.ensure_future(stub.CreateRun(create(), metadata=md)) for _ in range(10)]

    async def all_waiting() -> bool:
        return await lock_waiters(db) == 10

    await eventually(all_waiting, what="ten CreateRun calls waiting on the key")
    await tx.rollback()
    await holder.close()
    answers = await asyncio.gather(*calls)  # no error of any kind, unique violations included

    assert sorted(a.replayed for a in answers) == [False] + [True] * 9
    assert len({a.run.run_id for a in answers}) == 1
    assert len({(a.key_created_at.ToNanoseconds(), a.key_expires_at.ToNanoseconds()) for a in answers}) == 1
    first = next(a for a in answers if not a.replayed)
    assert all(a.run == first.run for a in answers)  # the replay is the first answer, as it was
    assert first.run.status == common_pb2.RUN_STATUS_PENDING and first.run.channel_type == common_pb2.CHANNEL_TYPE_API
    expires = first.key_expires_at.ToDatetime() - first.key_created_at.ToDatetime()
    assert expires.total_seconds() == 24 * 3600
    assert await runs(db) == 1
    assert await db.fetchval("SELECT count(*) FROM awooop_idempotency_key") == 1
    assert await db.fetchval("SELECT count(*) FROM awooop_audit_log WHERE action = 'RUN_CREATED'") == 1


async def test_same_key_with_another_payload_is_idempotency_conflict(start_services, channels, make_key, db) -> None:
    _rt, stub, md = await serve(start_services, channels, make_key)
    first = await stub.CreateRun(create(task="deploy"), metadata=md)
    for other in (
        create(task="rollback"),
        ingest_pb2.CreateRunRequest(**{**_fields(create(task="deploy")), "max_attempts": 7}),
    ):
        err = await expect_error(
            stub.CreateRun(other, metadata=md), grpc.StatusCode.ALREADY_EXISTS, "IDEMPOTENCY_CONFLICT"
        )
        meta = errors.error_info(err).metadata  # type: ignore[union-attr]
        assert meta["differs"] == "fingerprint"
        assert meta["first_seen_at"] == first.key_created_at.ToJsonString()
        assert meta["expires_at"] == first.key_expires_at.ToJsonString()
        assert first.run.run_id not in err.details()
    assert await runs(db) == 1
    # the first payload still replays
    assert (await stub.CreateRun(create(task="deploy"), metadata=md)).replayed


async def test_replay_after_membership_revoked_is_permission_denied(start_services, channels, make_key, db) -> None:
    # the interceptor trusts its cached roles for a minute: the replay's fresh re-check must catch it
    _rt, stub, md = await serve(start_services, channels, make_key, auth_cache_seconds=60)
    first = await stub.CreateRun(create(secret="s3"), metadata=md)
    await principals.revoke_role(db, "alice", PROJECT)
    err = await expect_error(
        stub.CreateRun(create(secret="s3"), metadata=md), grpc.StatusCode.PERMISSION_DENIED, "FORBIDDEN"
    )
    info = errors.error_info(err)
    assert info is not None and "run_id" not in info.metadata
    assert first.run.run_id not in err.details() and "s3" not in err.details()  # nothing from the snapshot
    trailers = b"".join(v if isinstance(v, bytes) else v.encode() for _, v in err.trailing_metadata() or ())
    assert first.run.run_id.encode() not in trailers and b"s3" not in trailers
    await principals.grant_role(db, "alice", PROJECT, "ingest")
    again = await stub.CreateRun(create(secret="s3"), metadata=md)
    assert again.replayed and again.run.run_id == first.run.run_id
    assert await runs(db) == 1


# --- the rest of the contract ------------------------------------------------------------------


def _fields(req: ingest_pb2.CreateRunRequest) -> dict[str, Any]:
    return {"project_id": req.project_id, "idempotency_key": req.idempotency_key, "input": req.input}


async def test_key_comes_from_field_or_metadata_and_is_required(start_services, channels, make_key, db) -> None:
    _rt, stub, md = await serve(start_services, channels, make_key)
    no_key = ingest_pb2.CreateRunRequest(project_id=PROJECT, input=struct({"a": 1}))
    err = await expect_error(stub.CreateRun(no_key, metadata=md), grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
    assert [v.field for v in errors.bad_request(err).field_violations] == ["idempotency_key"]  # type: ignore[union-attr]
    via_md = await stub.CreateRun(no_key, metadata=(*md, ("idempotency-key", "k-md")))
    via_field = await stub.CreateRun(create("k-md", a=1), metadata=md)
    assert via_field.replayed and via_field.run.run_id == via_md.run.run_id
    await expect_error(
        stub.CreateRun(create("k-a", a=1), metadata=(*md, ("idempotency-key", "k-b"))), grpc.StatusCode.INVALID_ARGUMENT
    )
    bad = [
        (ingest_pb2.CreateRunRequest(project_id="bad id!", idempotency_key="k"), "project_id"),
        (ingest_pb2.CreateRunRequest(project_id=PROJECT, idempotency_key="k" * 257), "idempotency_key"),
        (ingest_pb2.CreateRunRequest(project_id=PROJECT, idempotency_key="k", max_attempts=101), "max_attempts"),
        (create("k", blob="z" * 300_000), "input"),
    ]
    for req, field in bad:
        err = await expect_error(stub.CreateRun(req, metadata=md), grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
        assert [v.field for v in errors.bad_request(err).field_violations] == [field]  # type: ignore[union-attr]
    other = await make_key("bob", {"elsewhere": ["ingest"]})
    await expect_error(stub.CreateRun(create("k"), metadata=other), grpc.StatusCode.PERMISSION_DENIED, "FORBIDDEN")
    assert await runs(db) == 1


async def test_keys_are_scoped_to_the_principal(start_services, channels, make_key, db) -> None:
    _rt, stub, md = await serve(start_services, channels, make_key)
    woken: asyncio.Queue[str] = asyncio.Queue()
    await db.add_listener(RUN_READY_CHANNEL, lambda *args: woken.put_nowait(args[3]))
    bob = await make_key("bob", {PROJECT: ["admin"]})  # admin implies ingest
    a = await stub.CreateRun(create("shared"), metadata=md)
    assert await asyncio.wait_for(woken.get(), 5) == PROJECT  # waiting claimers hear of the new run
    b = await stub.CreateRun(create("shared", other="payload"), metadata=bob)
    assert not a.replayed and not b.replayed and a.run.run_id != b.run.run_id
    assert await runs(db) == 2


async def test_changed_policy_version_is_a_conflict(start_services, channels, make_key) -> None:
    _rt, stub, md = await serve(start_services, channels, make_key)
    await stub.CreateRun(create(), metadata=md)
    v2 = await start_services("ingest", policy_version="v2")
    stub2 = ingest_pb2_grpc.IngestServiceStub(channels(v2.ports["ingest"]))
    err = await expect_error(
        stub2.CreateRun(create(), metadata=md), grpc.StatusCode.ALREADY_EXISTS, "IDEMPOTENCY_CONFLICT"
    )
    assert errors.error_info(err).metadata["differs"] == "policy_version"  # type: ignore[union-attr]


async def test_an_expired_key_creates_a_new_run_and_pruning_removes_only_expired_keys(
    start_services, channels, make_key, db
) -> None:
    rt, stub, md = await serve(start_services, channels, make_key)
    old = await stub.CreateRun(create("k-old"), metadata=md)
    live = await stub.CreateRun(create("k-live"), metadata=md)
    await db.execute("UPDATE awooop_idempotency_key SET expires_at = now() - interval '1 second' WHERE key = 'k-old'")
    pruned = await retention.prune_idempotency_keys(rt.ctx.pool, batch=10)
    assert pruned == 1
    assert [r["key"] for r in await db.fetch("SELECT key FROM awooop_idempotency_key")] == ["k-live"]
    again = await stub.CreateRun(create("k-old"), metadata=md)
    assert not again.replayed and again.run.run_id != old.run.run_id
    assert (await stub.CreateRun(create("k-live"), metadata=md)).run.run_id == live.run.run_id
    # expired but not yet pruned: treated as absent all the same
    await db.execute("UPDATE awooop_idempotency_key SET expires_at = now() - interval '1 second' WHERE key = 'k-live'")
    fresh = await stub.CreateRun(create("k-live", changed="payload"), metadata=md)
    assert not fresh.replayed and fresh.run.run_id != live.run.run_id
    assert await runs(db) == 4


async def test_a_waiter_past_its_deadline_gets_deadline_exceeded(
    start_services, channels, make_key, db, db_dsn
) -> None:
    rt, stub, md = await serve(start_services, channels, make_key)
    holder = await asyncpg.connect(db_dsn)
    tx = await hold_lock(holder, lock_name("alice", "slow"))
    try:
        # over gRPC: whichever side notices first, the caller sees DEADLINE_EXCEEDED, never INTERNAL
        await expect_error(stub.CreateRun(create("slow"), metadata=md, timeout=0.5), grpc.StatusCode.DEADLINE_EXCEEDED)
        # the engine itself turns the lock wait into DEADLINE_EXCEEDED within the deadline
        scope = idempotency.Scope(PROJECT, "user", "alice", OPERATION, "slow")
        executed: list[int] = []

        async def execute(conn: asyncpg.Connection, window: idempotency.KeyWindow) -> idempotency.Executed:
            executed.append(1)
            return idempotency.Executed(b"")

        async def allow(conn: asyncpg.Connection) -> bool:
            return True

        with pytest.raises(errors.ServiceError) as exc:
            await idempotency.run_idempotent(
                rt.ctx.pool,
                scope=scope,
                fingerprint="0" * 64,
                policy_version="v1",
                ttl=60,
                deadline=time.monotonic() + 0.3,
                recheck=allow,
                execute=execute,
            )
        assert exc.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and executed == []
    finally:
        await tx.rollback()
        await holder.close()
    # released: the key works, and nothing was created while it waited
    assert not (await stub.CreateRun(create("slow"), metadata=md)).replayed
    assert await runs(db) == 1


async def test_the_engine_wraps_any_mutation(start_services, db) -> None:
    """Another operation (here: an audit-only mutation) gets the same replay semantics."""
    rt = await start_services("ingest")
    scope = idempotency.Scope(PROJECT, "service", "scheduler", "test.Annotate", str(uuid.uuid4()))

    async def execute(conn: asyncpg.Connection, window: idempotency.KeyWindow) -> idempotency.Executed:
        audit_id = await conn.fetchval(
            """INSERT INTO awooop_audit_log (project_id, actor, action) VALUES ($1, 'service:scheduler', 'NOTE')
               RETURNING audit_id""",
            PROJECT,
        )
        return idempotency.Executed(f"note {audit_id}".encode(), str(audit_id))

    async def allow(conn: asyncpg.Connection) -> bool:
        return True

    async def call(fp: str) -> idempotency.Outcome:
        return await idempotency.run_idempotent(
            rt.ctx.pool, scope=scope, fingerprint=fp, policy_version="p1", ttl=30, recheck=allow, execute=execute
        )

    fp = idempotency.fingerprint({"note": "hello"})
    results = await asyncio.gather(*(call(fp) for _ in range(5)))
    assert sorted(r.replayed for r in results) == [False, True, True, True, True]
    assert len({r.snapshot for r in results}) == 1 and len({r.resource_id for r in results}) == 1
    assert await db.fetchval("SELECT count(*) FROM awooop_audit_log WHERE action = 'NOTE'") == 1
    with pytest.raises(errors.ServiceError) as exc:
        await call(idempotency.fingerprint({"note": "other"}))
    assert exc.value.reason == errors.IDEMPOTENCY_CONFLICT
