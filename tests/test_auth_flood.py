"""Unknown API keys cost the store nothing per request: a flood of random, well-formed, all
different keys costs a bounded number of store queries per refresh interval, wrong secrets for
an existing key id are not read again per request, and every refusal is counted by reason.
Real services, real store; the store calls are counted on the real pool the authenticator uses."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import grpc
from prometheus_client import REGISTRY

from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from services.common import principals
from tests.harness.helpers import expect_error


class CountingPool:
    """The real pool, with its calls counted."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.calls = 0

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return await self.pool.fetch(*args, **kwargs)


def failures(reason: str) -> float:
    return REGISTRY.get_sample_value("awooop_auth_failures_total", {"reason": reason}) or 0.0


async def test_a_flood_of_unknown_keys_costs_a_bounded_number_of_store_queries(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    rt = await start_services("scheduler", auth_key_refresh_seconds=1.0)
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    good = await make_key("alice", {"p": ["worker"]})
    await stub.ListRuns(pb.ListRunsRequest(project_id="p"), metadata=good)
    auth = rt.authenticator
    assert auth is not None
    counting = CountingPool(auth.pool)
    auth.pool = auth.live.pool = counting
    before = failures("unknown_key")

    async def call(key: str) -> grpc.StatusCode:
        try:
            await stub.ListRuns(pb.ListRunsRequest(project_id="p"), metadata=(("authorization", f"Bearer {key}"),))
        except grpc.aio.AioRpcError as err:
            return err.code()
        return grpc.StatusCode.OK

    started = time.monotonic()
    keys = [f"awk_{secrets.token_hex(8)}_{secrets.token_hex(32)}" for _ in range(1000)]
    codes = await asyncio.gather(*(call(k) for k in keys))
    elapsed = time.monotonic() - started
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 1000
    # one refresh of the live key ids per interval at most (plus the one in flight at each end)
    assert counting.calls <= 2 + int(elapsed / 1.0), (counting.calls, elapsed)
    assert failures("unknown_key") - before == 1000

    # a key issued just now works on its first request
    issued = await principals.issue_key(db, "alice")
    await stub.ListRuns(pb.ListRunsRequest(project_id="p"), metadata=(("authorization", f"Bearer {issued.key}"),))

    # wrong secrets for an existing key id: the id is read once per cache period, not per request
    calls = counting.calls
    wrong_before = failures("wrong_secret")
    wrong = [f"awk_{issued.key_id}_{secrets.token_hex(32)}" for _ in range(200)]
    assert await asyncio.gather(*(call(k) for k in wrong)) == [grpc.StatusCode.UNAUTHENTICATED] * 200
    assert counting.calls - calls <= 1
    assert failures("wrong_secret") - wrong_before == 200
    # and the right one still works
    await stub.ListRuns(pb.ListRunsRequest(project_id="p"), metadata=(("authorization", f"Bearer {issued.key}"),))

    # missing and malformed authorization are counted too
    missing, malformed = failures("missing"), failures("malformed")
    await expect_error(stub.ListRuns(pb.ListRunsRequest(project_id="p")), grpc.StatusCode.UNAUTHENTICATED)
    await expect_error(
        stub.ListRuns(pb.ListRunsRequest(project_id="p"), metadata=(("authorization", "Bearer nope"),)),
        grpc.StatusCode.UNAUTHENTICATED,
    )
    assert (failures("missing") - missing, failures("malformed") - malformed) == (1, 1)


class SlowRefresh:
    """The real pool; each query of the live key ids takes `delay` longer, and says when it began."""

    def __init__(self, pool: Any, delay: float) -> None:
        self.pool = pool
        self.delay = delay
        self.began = asyncio.Event()

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        self.began.set()
        await asyncio.sleep(self.delay)
        return await self.pool.fetch(*args, **kwargs)


async def test_a_burst_of_calls_with_a_new_key_waits_for_one_refresh(
    start_services: Any, channels: Any, make_key: Any
) -> None:
    """A new worker fleet's first calls arrive while the refresh the first one started is running:
    that refresh finds the key and answers them all; none waits for the next one (30 s here)."""
    rt = await start_services("scheduler", auth_key_refresh_seconds=30.0)
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    auth = rt.authenticator
    assert auth is not None
    slow = SlowRefresh(auth.live.pool, delay=0.3)
    auth.live.pool = slow  # type: ignore[assignment]
    key = await make_key("fleet", {"p": ["worker"]})
    before = auth.live.refreshes
    first = asyncio.ensure_future(stub.ListRuns(pb.ListRunsRequest(project_id="p"), metadata=key))
    await slow.began.wait()  # the first call's refresh is running: the rest arrive after it began
    rest = [stub.ListRuns(pb.ListRunsRequest(project_id="p"), metadata=key) for _ in range(9)]
    answers = await asyncio.wait_for(asyncio.gather(first, *rest), timeout=15)
    assert len(answers) == 10
    assert auth.live.refreshes == before + 1
