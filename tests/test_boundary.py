"""The input boundary (services/common/jsonvalues.py, validate.py): JSON values that could not
be stored or returned are refused with INVALID_ARGUMENT / FIELD_INVALID naming the field, before
anything is written; what is accepted is returned by every RPC that returns it. Real services,
real store."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common import errors
from services.common.jsonvalues import MAX_DEPTH
from tests.harness.helpers import expect_error, served
from tests.harness.scheduler import insert_runs, lease, make_sched, run_row

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def nested(depth: int, *, lists: bool = False) -> struct_pb2.Struct:
    """A Struct `depth` levels deep (the top level is 1): objects, or objects holding arrays."""
    value: Any = {"leaf": 1} if not lists or depth % 2 else [1]
    for level in range(depth - 1, 0, -1):
        value = [value] if lists and level % 2 == 0 else {"x": value}
    s = struct_pb2.Struct()
    s.update(value)
    return s


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


def fields(err: grpc.aio.AioRpcError) -> list[str]:
    br = errors.bad_request(err)
    return [v.field for v in br.field_violations] if br else []


async def test_create_run_deeper_than_the_limit_is_refused_before_any_write(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    rt = await start_services("ingest", "scheduler")
    ingest = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    md = await make_key("alice", {"p": ["ingest", "worker"]})
    too_deep = nested(MAX_DEPTH + 1)
    assert depth_of(json_format.MessageToDict(too_deep)) == MAX_DEPTH + 1
    for _ in range(2):  # a retry with the same key gets the same clear answer
        err = await expect_error(
            ingest.CreateRun(
                ingest_pb2.CreateRunRequest(project_id="p", idempotency_key="k1", input=too_deep), metadata=md
            ),
            INVALID,
            errors.FIELD_INVALID,
        )
        assert fields(err) == ["input"]
        assert "nested deeper than 32" in err.details()
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state") == 0
    assert await db.fetchval("SELECT count(*) FROM awooop_idempotency_key") == 0

    # at the limit (objects, and objects holding arrays) a run is accepted, claimed and read back
    sched = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    made = []
    for i, lists in enumerate((False, True)):
        value = nested(MAX_DEPTH, lists=lists)
        resp = await ingest.CreateRun(
            ingest_pb2.CreateRunRequest(project_id="p", idempotency_key=f"ok{i}", input=value), metadata=md
        )
        assert resp.run.input == value
        made.append(resp.run.run_id)
    # a third, ordinary run claimed in the same batch is delivered too
    plain = await ingest.CreateRun(
        ingest_pb2.CreateRunRequest(project_id="p", idempotency_key="plain", input=nested(1)), metadata=md
    )
    claimed = await sched.ClaimRuns(pb.ClaimRunsRequest(worker_id="w", project_ids=["p"], max_runs=10), metadata=md)
    assert sorted(c.run.run_id for c in claimed.runs) == sorted([*made, plain.run.run_id])
    # and completed with an output at the limit, returned by CompleteRun and GetRun
    deep_out = nested(MAX_DEPTH)
    done = await sched.CompleteRun(pb.CompleteRunRequest(lease=claimed.runs[0].lease, output=deep_out), metadata=md)
    assert done.run.output == deep_out
    got = await sched.GetRun(pb.GetRunRequest(run_id=claimed.runs[0].run.run_id), metadata=md)
    assert got.run.output == deep_out


def bad_outputs() -> list[tuple[str, struct_pb2.Struct]]:
    out = []
    for name, value in (("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf)):
        s = struct_pb2.Struct()
        s.fields["n"].number_value = value
        out.append((name, s))
    s = struct_pb2.Struct()
    s.update({"text": "a\x00b"})
    out.append(("nul-string", s))
    s = struct_pb2.Struct()
    s.update({"k\x00": 1})
    out.append(("nul-key", s))
    out.append(("deep", nested(MAX_DEPTH + 1)))
    return out


async def test_outputs_that_jsonb_refuses_are_invalid_in_every_completion_path(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    s = await make_sched(start_services, channels, db, make_key)
    cases = bad_outputs()
    run_ids = await insert_runs(db, "p", len(cases))
    claimed = await s.claim(max_runs=len(cases))
    assert len(claimed) == len(cases)
    for (name, output), c in zip(cases, claimed, strict=True):
        err = await expect_error(
            s.stub.CompleteRun(pb.CompleteRunRequest(lease=c.lease, output=output), metadata=s.worker),
            INVALID,
            errors.FIELD_INVALID,
        )
        assert fields(err) == ["output"], name
        batch = pb.CompleteRunsRequest(runs=[pb.CompleteRunRequest(lease=c.lease, output=output)])
        err = await expect_error(s.stub.CompleteRuns(batch, metadata=s.worker), INVALID, errors.FIELD_INVALID)
        assert fields(err) == ["runs[0].output"], name
        claim = pb.ClaimRunsRequest(
            worker_id="w1", project_ids=["p"], complete=[pb.CompleteRunRequest(lease=c.lease, output=output)]
        )
        err = await expect_error(s.stub.ClaimRuns(claim, metadata=s.worker), INVALID, errors.FIELD_INVALID)
        assert fields(err) == ["complete[0].output"], name
    for run_id in run_ids:  # nothing was written: every run is still running its first attempt
        row = await run_row(db, run_id)
        assert (row["status"], row["attempt_count"], row["output"]) == ("RUNNING", 1, None)
    # and the leases still work
    ok = await s.stub.CompleteRun(pb.CompleteRunRequest(lease=lease(run_ids[0], 1)), metadata=s.worker)
    assert ok.run.status == common_pb2.RUN_STATUS_COMPLETED


async def _code(call: Awaitable[Any]) -> grpc.StatusCode:
    """The call's status code (OK when it succeeds): calls sent together, judged one by one."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


async def test_a_poison_telegram_update_id_fails_only_its_own_call(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    rt = await start_services("ingest")
    stub = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    md = await make_key("alice", {"p": ["ingest"]})

    def tg(update_id: float) -> ingest_pb2.IngestEventRequest:
        payload = struct_pb2.Struct()
        payload.update({"update_id": update_id, "message": {"text": "hi"}})
        return ingest_pb2.IngestEventRequest(
            project_id="p", channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM, payload=payload
        )

    good = [tg(i) for i in range(1, 301)]
    poison = [tg(1e300), tg(-1e300), tg(2.0**53), tg(1.5), tg(1e300)]
    calls = [*good[:150], *poison, *good[150:]]
    codes = await asyncio.gather(*(_code(stub.IngestEvent(r, metadata=md)) for r in calls))
    assert codes[:150] + codes[155:] == [grpc.StatusCode.OK] * 300
    assert codes[150:155] == [INVALID] * 5
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE project_id = 'p'") == 300
    err = await expect_error(stub.IngestEvent(tg(1e300), metadata=md), INVALID, errors.FIELD_INVALID)
    assert fields(err) == ["payload.update_id"]
    # the refused ids were not remembered as seen either
    assert (
        await db.fetchval("SELECT count(*) FROM awooop_channel_event_dedupe WHERE length(provider_event_id) > 20") == 0
    )


# --- undecodable requests ----------------------------------------------------------------------


def _raw(channel: grpc.aio.Channel, method: str) -> Any:
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


async def test_undecodable_requests_are_invalid_argument_malformed_request_counted_and_logged(
    start_services: Any, channels: Any, make_key: Any, caplog: Any
) -> None:

    rt = await start_services("ingest", "scheduler", "saga", "gateway", access_log=True)
    md = await make_key("alice", {"p": ["ingest", "worker"]})
    valid = ingest_pb2.CreateRunRequest(project_id="AAAAAAAA", idempotency_key="k").SerializeToString()
    bad_utf8 = valid.replace(b"AAAAAAAA", b"\xff\xfe\xfd\xfc\xc3\x28\xa0\xa1")
    cases = [
        ("ingest", "/awooop.ingest.v1.IngestService/CreateRun", b"\xff" * 10),
        ("ingest", "/awooop.ingest.v1.IngestService/CreateRun", bad_utf8),
        ("ingest", "/awooop.ingest.v1.IngestService/IngestEvent", b"\x0a\x05ab"),  # truncated field
        ("scheduler", "/awooop.scheduler.v1.SchedulerService/ClaimRuns", b"\xff" * 10),
        ("saga", "/awooop.saga.v1.SagaService/BeginStep", b"\xff" * 10),
        ("gateway", "/awooop.tools.v1.ToolGatewayService/ExecuteTool", b"\xff" * 10),
    ]

    def count(method: str) -> float:
        return served(method, "INVALID_ARGUMENT")

    caplog.set_level("DEBUG", logger="awooop.rpc")  # the access log's level
    for service, method, data in cases:
        before = count(method)
        call = _raw(channels(rt.ports[service]), method)
        err = await expect_error(call(data, metadata=md), INVALID, errors.MALFORMED_REQUEST)
        assert "not a valid" in err.details()
        assert count(method) == before + 1
        logged = [r for r in caplog.records if getattr(r, "method", "") == method]
        assert logged and logged[-1].code == "INVALID_ARGUMENT"


# --- blast radius of one -----------------------------------------------------------------------


async def test_an_item_the_store_refuses_fails_only_its_own_caller_among_coalesced_neighbours(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    """Validation catches what it knows; for anything else the store refuses (here a CHECK the
    test adds), a coalesced statement that fails is settled caller by caller."""
    await db.execute(
        "ALTER TABLE awooop_run_state ADD CONSTRAINT test_no_poison CHECK (NOT (input ? 'poison')) NOT VALID"
    )
    rt = await start_services("ingest")
    stub = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    md = await make_key("alice", {"p": ["ingest"]})

    def tg(update_id: int, poison: bool = False) -> ingest_pb2.IngestEventRequest:
        payload = struct_pb2.Struct()
        payload.update({"update_id": update_id, **({"poison": True} if poison else {})})
        return ingest_pb2.IngestEventRequest(
            project_id="p", channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM, payload=payload
        )

    calls = [tg(i, poison=i % 60 == 0) for i in range(1, 306)]
    codes = await asyncio.gather(*(_code(stub.IngestEvent(r, metadata=md)) for r in calls))
    good = [c for r, c in zip(calls, codes, strict=True) if "poison" not in r.payload.fields]
    bad = [c for r, c in zip(calls, codes, strict=True) if "poison" in r.payload.fields]
    assert good == [grpc.StatusCode.OK] * 300
    assert len(bad) == 5 and grpc.StatusCode.OK not in bad
    assert await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE project_id = 'p'") == 300


def test_the_encoded_size_never_exceeds_the_bound_the_check_relies_on() -> None:
    """check_struct skips measuring the encoding when JSON x ENCODED_PER_JSON_BYTE is under the
    limit; the worst shapes stay well within that bound."""
    from services.common import jsonvalues

    shapes: list[Any] = [
        {"n": [1] * 1000},
        {"n": [[1]] * 500},
        {"a": [[[[[[[[1]]]]]]]]},
        {str(i): 1 for i in range(500)},
        {"e": [{}] * 500},
        {"l": [[]] * 500},
        {"s": [""] * 500},
        {"b": [True, None] * 250},
        {"x": {"y": {"z": {"w": 1}}}},
        {"k": [{"a": 1}] * 300},
    ]
    for shape in shapes:
        s = struct_pb2.Struct()
        s.update(shape)
        ratio = s.ByteSize() / jsonvalues.json_size(shape)
        assert ratio < jsonvalues.ENCODED_PER_JSON_BYTE * 0.8, (shape, ratio)
