"""The worker SDK retries a claim whose answer was lost with the same claim id, so the run it
claimed is handled at once under that claim's lease, not left RUNNING until its lease expires.
Real scheduler over real gRPC; the answer is lost on a real TCP connection (tests/harness/wire.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from prometheus_client import REGISTRY

from awooop.worker import AwooopError, ErrorDetails, RunContext, Worker
from awooop.worker.claim_ids import ClaimIds
from services.scheduler import claim_answers
from tests.harness.helpers import eventually, key_of
from tests.harness.scheduler import audit_actions, claims_waiting, insert_runs, run_row
from tests.harness.wire import HoldingProxy


def _replays() -> float:
    return REGISTRY.get_sample_value("awooop_scheduler_claim_replays_total") or 0.0


async def test_a_claim_whose_answer_was_lost_is_retried_with_its_id_and_handled_under_its_lease(
    start_services: Any, make_key: Any, db: Any
) -> None:
    rt = await start_services("scheduler", reaper_interval=3600)
    key = key_of(await make_key("worker-pod", {"p": ["worker"]}, "service"))
    proxy = await HoldingProxy(rt.ports["scheduler"]).start()
    seen: list[tuple[str, int]] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        seen.append((ctx.run_id, ctx.lease.attempt))
        return {"ok": True}

    # a lease far longer than the test: a run left to its lease is never handled in time
    worker = Worker(
        handler,
        projects=["p"],
        key=key,
        scheduler=f"127.0.0.1:{proxy.port}",
        worker_id="w-retry",
        lease_ttl=600,
        claim_wait=1,
        call_timeout=2,
    )
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    replays = _replays()
    try:
        await eventually(lambda: claims_waiting(1), what="the worker's long-poll")
        proxy.held = True
        (rid,) = await insert_runs(db, "p", 1)

        async def claimed() -> bool:
            return (await run_row(db, rid))["status"] == "RUNNING"

        await eventually(claimed, what="the scheduler to claim the run for the worker")
        assert not seen

        async def deadline_passed() -> bool:
            return worker.stats.claim_errors >= 1

        await eventually(deadline_passed, what="the worker's claim to fail (its answer was lost)")
        await proxy.reset()  # the network comes back

        async def handled() -> bool:
            return (await run_row(db, rid))["status"] == "COMPLETED"

        await eventually(handled, what="the run handled under the lost claim's lease")
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
        await proxy.close()
    assert seen == [(rid, 1)]
    assert (await audit_actions(db, rid)).count("CLAIMED") == 1
    assert _replays() > replays
    answers = await db.fetch(f"SELECT claim_id FROM {claim_answers.TABLE} WHERE worker_id = 'w-retry'")
    assert len(answers) == 1


def test_a_claim_keeps_its_id_until_it_is_answered_or_surely_failed() -> None:
    ids = ClaimIds()
    first = ids.next(4)
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        ids.answered(AwooopError(ErrorDetails(code, "", "lost")))
        assert ids.next(2) == first  # the same claim again, with its max_runs
    ids.answered()
    second = ids.next(2)
    assert second[0] != first[0] and second[1] == 2
    ids.answered(AwooopError(ErrorDetails(grpc.StatusCode.PERMISSION_DENIED, "FORBIDDEN", "no")))
    assert ids.next(2)[0] not in (first[0], second[0])
