"""No silent CANCELLED under bursts: more concurrent calls than one server admits are answered
UNAVAILABLE / OVERLOADED at once (counted, logged, retryable), never cancelled by gRPC core
without the handler running; the SDK retries them with backoff. Real scheduler, real channels,
bounded bursts on loopback."""

from __future__ import annotations

import asyncio
import collections
import uuid
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from awooop.worker import AwooopError, Client
from services.common import errors
from tests.harness.helpers import eventually, served
from tests.harness.scheduler import claims_waiting, insert_runs

GET_RUN = "/awooop.scheduler.v1.SchedulerService/GetRun"


def served_get_run(code: str) -> float:
    return served(GET_RUN, code)


async def _burst(stub: Any, md: Any, n: int) -> collections.Counter[str]:
    async def one() -> str:
        try:
            await stub.GetRun(pb.GetRunRequest(run_id=str(uuid.uuid4())), metadata=md, timeout=60)
        except grpc.aio.AioRpcError as err:
            reason = errors.error_info(err)
            return f"{err.code().name}/{reason.reason if reason else ''}"
        return "OK"

    return collections.Counter(await asyncio.gather(*(one() for _ in range(n))))


async def test_a_burst_past_grpc_cores_pending_queue_is_answered_not_cancelled(
    start_services: Any, channels: Any, make_key: Any
) -> None:
    rt = await start_services("scheduler")
    md = await make_key("w", {"p": ["worker"]})
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    await stub.ListRuns(pb.ListRunsRequest(project_id="p"), metadata=md)
    codes = await _burst(stub, md, 2500)  # gRPC core's default queue cancels past 1000
    assert codes == {"NOT_FOUND/NOT_FOUND": 2500}, codes


async def test_overload_is_an_explicit_retryable_unavailable_and_the_sdk_retries_it(
    start_services: Any, channels: Any, make_key: Any, db: Any
) -> None:
    rt = await start_services("scheduler", max_concurrent_rpcs=20)
    md = await make_key("w", {"p": ["worker"]})
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    await stub.ListRuns(pb.ListRunsRequest(project_id="p"), metadata=md)
    # 20 long-polling claims hold every slot
    polls = [
        asyncio.ensure_future(
            stub.ClaimRuns(
                pb.ClaimRunsRequest(worker_id=f"w{i}", project_ids=["p"], wait=duration_pb2.Duration(seconds=30)),
                metadata=md,
                timeout=60,
            )
        )
        for i in range(20)
    ]
    await eventually(lambda: claims_waiting(20), what="20 waiting claims")
    before = served_get_run("UNAVAILABLE")
    codes = await _burst(stub, md, 200)
    assert codes == {"UNAVAILABLE/OVERLOADED": 200}, codes
    assert served_get_run("UNAVAILABLE") - before == 200  # counted, not silent

    # the SDK retries it with backoff (its retry policy: UNAVAILABLE, 4 attempts)
    client = Client(
        key=dict(md)["authorization"].removeprefix("Bearer "), scheduler=f"127.0.0.1:{rt.ports['scheduler']}"
    )
    try:
        before = served_get_run("UNAVAILABLE")
        try:
            await client.call(client.scheduler.GetRun, pb.GetRunRequest(run_id=str(uuid.uuid4())), timeout=30)
        except AwooopError as err:
            assert err.reason == errors.OVERLOADED and err.code == grpc.StatusCode.UNAVAILABLE
        else:
            raise AssertionError("admitted past the limit")
        assert served_get_run("UNAVAILABLE") - before == 4
        # work arrives, the claims answer and free their slots: calls are admitted again
        await insert_runs(db, "p", 20)
        claimed = await asyncio.gather(*polls)
        assert sum(len(c.runs) for c in claimed) == 20
        with pytest.raises(AwooopError) as exc:
            await client.call(client.scheduler.GetRun, pb.GetRunRequest(run_id=str(uuid.uuid4())), timeout=30)
        assert exc.value.reason == errors.NOT_FOUND
    finally:
        await client.close()
