"""Hostile input, bounded in time: every RPC of every service is fed generated requests
(hypothesis, from the protobuf descriptors: extreme numbers, NaN and Infinity, NUL and huge
strings, malformed ids, unknown enum values, deep and large Structs, out-of-range durations)
and raw malformed bytes. No answer may be INTERNAL or UNKNOWN (or a CANCELLED nobody asked
for), and a refused input (INVALID_ARGUMENT) must have changed nothing in the store.

The services run in a thread with their own event loop (hypothesis drives a plain function);
the caller holds admin in every project, so requests get past the role checks to the logic.
The answers by status code are printed at the end (run with -s to see them)."""

from __future__ import annotations

import asyncio
import collections
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg
import grpc
import pytest
from google.protobuf import descriptor, message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from awooop.ingest.v1 import ingest_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.tools.v1 import tools_pb2
from services.common import principals
from services.common.runtime import Runtime
from services.common.settings import Settings
from tests.harness.databases import with_database

SERVICES = {
    "ingest": ingest_pb2.DESCRIPTOR.services_by_name["IngestService"],
    "scheduler": scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"],
    "saga": saga_pb2.DESCRIPTOR.services_by_name["SagaService"],
    "gateway": tools_pb2.DESCRIPTOR.services_by_name["ToolGatewayService"],
}
METHODS = [(svc, m) for svc, d in SERVICES.items() for m in d.methods]
FORBIDDEN_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED}
EXAMPLES = 30  # per RPC; with the raw-bytes cases about 1,500 calls in all

COUNTS: collections.Counter[str] = collections.Counter()

# The store's observable state: a refused request must leave it as it was.
STATE_SQL = """SELECT (SELECT count(*) FROM awooop_run_state),
       (SELECT md5(coalesce(string_agg(r::text, '' ORDER BY run_id), '')) FROM awooop_run_state r),
       (SELECT count(*) FROM awooop_audit_log), (SELECT count(*) FROM awooop_saga_step),
       (SELECT count(*) FROM awooop_idempotency_key), (SELECT count(*) FROM awooop_channel_event_dedupe),
       (SELECT count(*) FROM awooop_compensation_request), (SELECT count(*) FROM awooop_refgw_call),
       (SELECT count(*) FROM awooop_api_key)"""


class Suite:
    """The four services in one Runtime on a loop of their own thread."""

    def __init__(self, s: Settings) -> None:
        self.settings = s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.rt = Runtime(s, list(SERVICES), port_zero=True)
        self.run(self.rt.start())
        self.conn: asyncpg.Connection = self.run(asyncpg.connect(s.database_url))
        self.key = self.run(self._admin_key())
        self.run_ids: list[str] = self.run(self._runs())
        self.channels = {n: grpc.insecure_channel(f"127.0.0.1:{p}") for n, p in self.rt.ports.items()}

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _admin_key(self) -> str:
        await principals.create_principal(self.conn, "fuzzer", "service")
        await principals.grant_role(self.conn, "fuzzer", principals.ALL_PROJECTS, "admin")
        return (await principals.issue_key(self.conn, "fuzzer")).key

    async def _runs(self) -> list[str]:
        """Runs in several states, so generated ids and leases sometimes name real ones."""
        rows = await self.conn.fetch(
            """INSERT INTO awooop_run_state (project_id, channel_type, input, status, attempt_count, worker_id,
                                             lease_until, heartbeat_at)
               SELECT 'p', 'api', jsonb_build_object('n', g),
                      CASE WHEN g % 2 = 0 THEN 'RUNNING' ELSE 'PENDING' END,
                      CASE WHEN g % 2 = 0 THEN 1 ELSE 0 END,
                      CASE WHEN g % 2 = 0 THEN 'w1' END,
                      CASE WHEN g % 2 = 0 THEN now() + interval '1 hour' END,
                      CASE WHEN g % 2 = 0 THEN now() END
                 FROM generate_series(1, 6) g RETURNING run_id"""
        )
        return [str(r["run_id"]) for r in rows]

    def state(self) -> tuple[Any, ...]:
        return tuple(self.run(self.conn.fetchrow(STATE_SQL)))

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
        self.run(self.conn.close())
        self.run(self.rt.stop(0.2))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def suite(pg_server_dsn: str, template_db: str, redis_url: str) -> Iterator[Suite]:
    name = f"awooop_fuzz_{uuid.uuid4().hex[:10]}"
    admin = with_database(pg_server_dsn, "postgres")

    async def db(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(db(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"'))
    s = Settings.from_env().with_(
        database_url=with_database(pg_server_dsn, name),
        redis_url=redis_url,
        redis_prefix=f"awooop:{name}:",
        metrics_port=0,
        access_log=False,
        shutdown_grace=0.5,
        db_pool_min=1,
        saga_addr="",
        internal_api_key="",
        max_claim_wait=0.2,  # generated long-polls end quickly
        reaper_interval=3600,
        compensation_interval=3600,
        approval_sweep_interval=3600,
        prune_interval=3600,
    )
    su = Suite(s)
    try:
        yield su
    finally:
        su.close()
        asyncio.run(db(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        print("\nhostile-input calls by status code:", dict(sorted(COUNTS.items())))


# --------------------------------------------------------------------------- strategies

NASTY_TEXT = [
    "",
    "\x00",
    "a\x00b",
    "x" * 5000,
    "é" * 3000,
    "p",
    "*",
    "../../etc",
    "' OR 1=1 --",
    "\U0001f600",
    "1e300",
    "-1",
    "00000000-0000-0000-0000-000000000000",
    "awk_x_y",
]


def json_values(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([1e300, -1e300, 2.0**53, 2.0**63, 0.5]),
        st.text(max_size=20),
        st.sampled_from(NASTY_TEXT),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.one_of(st.text(max_size=8), st.just("\x00")), inner, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def deep(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"x": value}
    return value


def struct_values() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.dictionaries(st.text(max_size=10), json_values(), max_size=5),
        st.sampled_from([deep(31), deep(32), deep(33), deep(40)]).map(lambda d: {"d": d}),
        st.just({"blob": "x" * 300_000}),  # over the payload limit
        st.just({"n": [1] * 30_000}),  # small as JSON, large encoded
        st.just({"update_id": 1e300}),
    )


def scalar(field: descriptor.FieldDescriptor, run_ids: list[str]) -> st.SearchStrategy[Any]:
    t = field.type
    if t == field.TYPE_STRING:
        return st.one_of(st.text(max_size=40), st.sampled_from(NASTY_TEXT), st.sampled_from(run_ids))
    if t == field.TYPE_BYTES:
        return st.binary(max_size=40)
    if t == field.TYPE_BOOL:
        return st.booleans()
    if t in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=64 if t == field.TYPE_DOUBLE else 32)
    if t == field.TYPE_ENUM:
        return st.integers(-3, 40)  # proto3 enums are open: unknown values arrive as numbers
    if t in (field.TYPE_INT32, field.TYPE_SINT32, field.TYPE_SFIXED32):
        return st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, 2, -1, 1000, 2**31 - 1]))
    if t in (field.TYPE_UINT32, field.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if t in (field.TYPE_UINT64, field.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    return st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, -1, 2**63 - 1]))


def messages(desc: descriptor.Descriptor, run_ids: list[str], depth: int = 0) -> st.SearchStrategy[Any]:
    cls = message_factory.GetMessageClass(desc)
    if desc.full_name == "google.protobuf.Struct":
        return struct_values().map(_struct)
    if desc.full_name in ("google.protobuf.Duration", "google.protobuf.Timestamp"):
        return st.builds(
            lambda s, n: cls(seconds=s, nanos=n),
            st.one_of(st.integers(-(10**11), 10**11), st.integers(-5, 100)),
            st.integers(-999_999_999, 999_999_999),
        )
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in desc.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            fields[f.name] = st.dictionaries(st.text(max_size=20), st.text(max_size=40), max_size=4)
        elif f.message_type is not None:
            if depth >= 3:
                continue
            inner = messages(f.message_type, run_ids, depth + 1)
            fields[f.name] = st.lists(inner, max_size=3) if _repeated(f) else inner
        else:
            inner = scalar(f, run_ids)
            fields[f.name] = st.lists(inner, max_size=4) if _repeated(f) else inner
    chosen = st.fixed_dictionaries({}, optional=fields)
    return chosen.map(lambda values: _build(cls, desc, values))


def _repeated(f: descriptor.FieldDescriptor) -> bool:
    return bool(f.is_repeated)


def _struct(data: dict[str, Any]) -> Any:
    from google.protobuf import struct_pb2

    s = struct_pb2.Struct()
    try:
        s.update(data)
    except (ValueError, TypeError):
        s.update({"fallback": True})
    return s


def _build(cls: Any, desc: descriptor.Descriptor, values: dict[str, Any]) -> Any:
    msg = cls()
    for name, value in values.items():
        f = desc.fields_by_name[name]
        try:
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                getattr(msg, name).update(value)
            elif f.message_type is not None:
                if _repeated(f):
                    getattr(msg, name).extend(value)
                else:
                    getattr(msg, name).CopyFrom(value)
            elif _repeated(f):
                getattr(msg, name).extend(value)
            else:
                setattr(msg, name, value)
        except Exception:  # a float32 out of range, nesting past what protobuf builds: leave it unset
            msg.ClearField(name)
    return msg


# --------------------------------------------------------------------------- the calls


def _call(suite: Suite, service: str, method: descriptor.MethodDescriptor, request: bytes) -> grpc.StatusCode:
    path = f"/{method.containing_service.full_name}/{method.name}"
    md = (("authorization", f"Bearer {suite.key}"), ("idempotency-key", "fuzz-key"))
    if method.server_streaming:  # WatchRun: a valid watch of a run still going follows it until the deadline
        stream: Callable[..., Any] = suite.channels[service].unary_stream(path)
        try:
            for _ in stream(request, metadata=md, timeout=2):
                pass
        except grpc.RpcError as err:
            return grpc.StatusCode.OK if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED else err.code()
        return grpc.StatusCode.OK
    rpc: Callable[..., Any] = suite.channels[service].unary_unary(path)
    try:
        rpc(request, metadata=md, timeout=20)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def _check(suite: Suite, service: str, method: descriptor.MethodDescriptor, request: bytes) -> None:
    before = suite.state()
    code = _call(suite, service, method, request)
    COUNTS[code.name] += 1
    assert code not in FORBIDDEN_CODES, f"{method.full_name} answered {code.name} to {request[:200]!r}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert suite.state() == before, f"{method.full_name} refused the input but changed the store"


@pytest.mark.parametrize(("service", "method"), METHODS, ids=[f"{s}.{m.name}" for s, m in METHODS])
def test_generated_requests_never_reach_internal_and_refusals_change_nothing(
    suite: Suite, service: str, method: descriptor.MethodDescriptor
) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(messages(method.input_type, suite.run_ids))
    def run(request: Any) -> None:
        _check(suite, service, method, request.SerializeToString())

    run()


@pytest.mark.parametrize(("service", "method"), METHODS, ids=[f"{s}.{m.name}" for s, m in METHODS])
def test_malformed_bytes_are_invalid_argument(suite: Suite, service: str, method: descriptor.MethodDescriptor) -> None:
    @settings(max_examples=10, deadline=None, database=None, derandomize=True)
    @given(st.one_of(st.binary(min_size=1, max_size=64), st.just(b"\xff" * 10), st.just(b"\x0a\x05ab")))
    def run(data: bytes) -> None:
        _check(suite, service, method, data)

    run()
